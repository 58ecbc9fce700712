#pragma once
/// @file
/// The file under Optuna's JournalStorage (Optuna 5, `optuna.storages.journal.JournalFileBackend`): an append-only
/// text file of one record per line, shared by every process that opens it. This component knows lines and the
/// lock, not what a line means (that is trainkit/tune/optuna_journal.h).
///
/// Reading hands out complete lines only: a last line without its newline is being written, and is read by a later
/// read_lines(). Writing takes Optuna's default lock, JournalFileSymlinkLock: `symlink(path, path + ".lock")`
/// succeeds for one process at a time; the others retry (1 ms doubling to 1 s), and break a lock under which the
/// file's modification time has not changed for `grace_period_s` (Optuna's 30 s), as Optuna does for a lock left by
/// a killed process. Under the lock, a file that does not end with a newline lost its last write to a killed
/// writer: that torn tail is cut off (with a warning) before anything is appended. Each append is one write,
/// fsync'ed.
///
/// ```
/// JournalFile file("study.journal");
/// file.locked([&] { file.append("{\"op_code\":0,...}\n"); });
/// for (const auto& line : file.read_lines()) { ... }
/// ```

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/arg.h>

namespace trainkit::tune {

/// Options of JournalFile: `JournalFileOptions().grace_period_s(30)`.
struct JournalFileOptions {
  /// Seconds a lock may stand while the file does not change before it is broken (Optuna's default).
  TORCH_ARG(double, grace_period_s) = 30;
};

/// An append-only journal file under Optuna's symlink lock.
class JournalFile {
 public:
  /// Opens `path`, creating an empty file when there is none (as Optuna does). Throws std::runtime_error naming
  /// the file when it cannot be created, std::invalid_argument for a grace period that is not > 0.
  explicit JournalFile(std::string path, JournalFileOptions options = {});

  /// The complete lines (without their newline) appended since the last call; the first call reads from the
  /// start. Throws std::runtime_error naming the file when it cannot be read.
  std::vector<std::string> read_lines();
  /// Runs `body` holding the lock, after cutting a torn last line; the lock is released when `body` returns or
  /// throws.
  void locked(const std::function<void()>& body);
  /// Appends `text` (whole lines, each ending with '\n') in one write and fsyncs it; call it inside locked().
  /// Throws std::runtime_error naming the file when it cannot write.
  void append(const std::string& text);

  const std::string& path() const { return path_; }
  const JournalFileOptions& options() const { return options_; }

 private:
  std::string path_;
  JournalFileOptions options_;
  int64_t offset_ = 0;  // bytes of complete lines read so far
};

/// A fresh worker id as Optuna writes one: "<uuid4>-<pid>".
std::string new_worker_id();

}  // namespace trainkit::tune
