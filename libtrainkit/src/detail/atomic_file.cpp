#include "detail/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

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

}  // namespace

void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write,
                       const std::function<void()>& before_rename) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::path tmp = dir / fmt::format(".{}.tmp.{}", target.filename().string(), ::getpid());
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) {
        throw AtomicWriteError(fmt::format("{}: cannot create: {}", tmp.string(), std::strerror(errno)));
      }
      write(out);
      out.flush();
      if (!out) {
        const int err = errno;
        throw AtomicWriteError(fmt::format("{}: write failed: {} (disk full or file size limit?)", tmp.string(),
                                           std::strerror(err)));
      }
    }
    fsync_path(tmp.string(), O_RDONLY);
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
