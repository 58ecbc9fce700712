#pragma once
// Atomic file writing, shared by every area that writes files (checkpoints, weights, run files): each
// area wraps AtomicWriteError into its own error type (the error policy in trainkit/args.h).

#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>

namespace trainkit::detail {

/// A temporary file that could not be created, written, fsync'ed or renamed; what() names the file.
class AtomicWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Writes a file atomically: `write` fills a temporary ".<name>.tmp.<pid>.<random>" in the same directory,
/// created exclusively and never through a symbolic link, which is flushed, fsync'ed and renamed over
/// `path`; then the directory is fsync'ed. `before_rename`, when set,
/// runs between the fsync and the rename (a fault-injection point for tests). If anything throws, the
/// temporary is removed and `path` is untouched.
void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write,
                       const std::function<void()>& before_rename = {});

}  // namespace trainkit::detail
