#include "trainkit/tune/journal_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace trainkit::tune {
namespace {

/// Optuna's JournalFileSymlinkLock (optuna/storages/journal/_file.py), held for the object's lifetime.
class SymlinkLock {
 public:
  SymlinkLock(const std::string& target, double grace_period_s) : target_(target), lock_(target + ".lock") {
    using Clock = std::chrono::steady_clock;
    double sleep_s = 0.001;
    auto last_change = Clock::now();
    auto last_warning = Clock::now();
    std::optional<std::pair<int64_t, int64_t>> mtime;
    while (::symlink(target_.c_str(), lock_.c_str()) != 0) {
      if (errno != EEXIST) throw std::runtime_error(fmt::format("{}: cannot lock: {}", lock_, std::strerror(errno)));
      if (Clock::now() - last_warning > std::chrono::seconds(10)) {
        spdlog::warn("{}: waiting more than 10 s for the lock; retrying", lock_);
        last_warning = Clock::now();
      }
      // As Optuna: stat() follows the link, so this is the journal's own modification time.
      struct stat st {};
      if (::stat(lock_.c_str(), &st) != 0) continue;
      const std::pair<int64_t, int64_t> now_mtime{st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
      if (mtime != now_mtime) {
        mtime = now_mtime;
        last_change = Clock::now();
      }
      if (std::chrono::duration<double>(Clock::now() - last_change).count() > grace_period_s) {
        spdlog::warn("{}: the lock has stood for {} s with no change to the journal (a killed writer's); breaking it",
                     lock_, grace_period_s);
        last_warning = Clock::now();
        if (release()) sleep_s = 0.001;
        continue;
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
      sleep_s = std::min(sleep_s * 2, 1.0);
    }
  }
  ~SymlinkLock() {
    if (!release()) spdlog::warn("{}: the lock was gone when released (broken by another process)", lock_);
  }
  SymlinkLock(const SymlinkLock&) = delete;
  SymlinkLock& operator=(const SymlinkLock&) = delete;

 private:
  // Rename, then unlink: of several processes breaking one stale lock, only one renames it.
  bool release() const {
    const std::string renamed = lock_ + new_worker_id() + ".rename";
    if (::rename(lock_.c_str(), renamed.c_str()) != 0) return false;
    ::unlink(renamed.c_str());
    return true;
  }
  std::string target_;
  std::string lock_;
};

/// Cuts a last line without its newline (a write a killed process left torn); called under the lock.
void cut_torn_tail(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  const std::streamoff size = in.tellg();
  if (size <= 0) return;
  std::streamoff keep = size;
  const std::streamoff block = 4096;
  std::string buf;
  bool torn = false;
  for (std::streamoff end = size; end > 0; end -= block) {
    const std::streamoff start = std::max<std::streamoff>(0, end - block);
    buf.resize(static_cast<size_t>(end - start));
    in.seekg(start);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (end == size && buf.back() == '\n') return;
    torn = true;
    const size_t nl = buf.rfind('\n');
    if (nl != std::string::npos) {
      keep = start + static_cast<std::streamoff>(nl) + 1;
      break;
    }
    keep = 0;
  }
  if (!torn) return;
  spdlog::warn("{}: cutting {} bytes of a last line without its newline (a write interrupted by a killed process)",
               path, size - keep);
  if (::truncate(path.c_str(), keep) != 0) {
    throw std::runtime_error(fmt::format("{}: cannot cut a torn last line: {}", path, std::strerror(errno)));
  }
}

}  // namespace

std::string new_worker_id() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  const uint64_t hi = (gen() & 0xffffffffffff0fffULL) | 0x0000000000004000ULL;  // version 4
  const uint64_t lo = (gen() & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;  // variant 10
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}-{}", hi >> 32, (hi >> 16) & 0xffff, hi & 0xffff, lo >> 48,
                     lo & 0xffffffffffffULL, ::getpid());
}

JournalFile::JournalFile(std::string path, JournalFileOptions options)
    : path_(std::move(path)), options_(std::move(options)) {
  if (!(options_.grace_period_s() > 0)) {
    throw std::invalid_argument(
        fmt::format("JournalFile: grace_period_s must be > 0, got {}", options_.grace_period_s()));
  }
  append("");  // creates the file when there is none, as JournalFileBackend does
}

std::vector<std::string> JournalFile::read_lines() {
  std::ifstream in(path_, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open", path_));
  in.seekg(offset_);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', start)) {
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  offset_ += static_cast<int64_t>(start);
  return lines;
}

void JournalFile::locked(const std::function<void()>& body) {
  SymlinkLock lock(path_, options_.grace_period_s());
  cut_torn_tail(path_);
  body();
}

void JournalFile::append(const std::string& text) {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("{}: cannot open for appending: {}", path_, std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(fmt::format("{}: cannot write: {}", path_, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!synced) throw std::runtime_error(fmt::format("{}: cannot fsync: {}", path_, std::strerror(err)));
}

}  // namespace trainkit::tune
