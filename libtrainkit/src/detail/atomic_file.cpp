#include "detail/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <streambuf>
#include <vector>

#include <fmt/format.h>

namespace trainkit::detail {
namespace {

namespace fs = std::filesystem;

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) {
    throw AtomicWriteError(fmt::format("{}: cannot open for fsync: {}", path, std::strerror(errno)));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    throw AtomicWriteError(fmt::format("{}: fsync failed: {}", path, std::strerror(err)));
  }
}

/// An output stream buffer over a file descriptor it owns (closed by close() or the destructor).
class FdBuffer : public std::streambuf {
 public:
  explicit FdBuffer(int fd) : fd_(fd), buffer_(1 << 16) { setp(buffer_.data(), buffer_.data() + buffer_.size()); }
  ~FdBuffer() override {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  FdBuffer(const FdBuffer&) = delete;
  FdBuffer& operator=(const FdBuffer&) = delete;
  /// Flushes and closes; false (errno set) when a write or the close failed.
  bool close() {
    const bool flushed = sync() == 0;
    const int err = errno;
    const int rc = ::close(fd_);
    fd_ = -1;
    if (!flushed) {
      errno = err;
    }
    return flushed && rc == 0;
  }
  int fd() const { return fd_; }

 protected:
  int_type overflow(int_type c) override {
    if (sync() != 0) {
      return traits_type::eof();
    }
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  int sync() override {
    const char* p = pbase();
    while (p < pptr()) {
      const ssize_t n = ::write(fd_, p, static_cast<size_t>(pptr() - p));
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n <= 0) {
        return -1;
      }
      p += n;
    }
    setp(buffer_.data(), buffer_.data() + buffer_.size());
    return 0;
  }

 private:
  int fd_;
  std::vector<char> buffer_;
};

/// Creates the temporary beside `target` exclusively (O_EXCL) and never through a symbolic link
/// (O_NOFOLLOW): a name that exists -- a stale temporary, or a link planted to redirect the write -- is
/// skipped for another one. Returns the descriptor and sets `tmp`.
int create_temporary(const fs::path& dir, const fs::path& target, fs::path& tmp) {
  std::random_device random;
  for (int attempt = 0; attempt < 16; ++attempt) {
    tmp = dir / fmt::format(".{}.tmp.{}.{:08x}", target.filename().string(), ::getpid(), random());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) {
      return fd;
    }
    if (errno != EEXIST) {
      throw AtomicWriteError(fmt::format("{}: cannot create: {}", tmp.string(), std::strerror(errno)));
    }
  }
  throw AtomicWriteError(fmt::format("{}: cannot create a temporary beside it: 16 names were taken", target.string()));
}

}  // namespace

void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write,
                       const std::function<void()>& before_rename) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  fs::path tmp;
  const int fd = create_temporary(dir, target, tmp);
  try {
    {
      FdBuffer buffer(fd);
      std::ostream out(&buffer);
      write(out);
      out.flush();
      if (!out || !buffer.close()) {
        const int err = errno;
        throw AtomicWriteError(fmt::format("{}: write failed: {} (disk full or file size limit?)", tmp.string(),
                                           std::strerror(err)));
      }
    }
    fsync_path(tmp.string(), O_RDONLY | O_NOFOLLOW);
    if (before_rename) {
      before_rename();
    }
    std::error_code ec;
    fs::rename(tmp, target, ec);
    if (ec) {
      throw AtomicWriteError(fmt::format("{}: rename from {} failed: {}", path, tmp.string(), ec.message()));
    }
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  fsync_path(dir.string(), O_RDONLY | O_DIRECTORY);
}

}  // namespace trainkit::detail
