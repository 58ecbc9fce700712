#pragma once
/// @file
/// Child processes (POSIX): start a program with its arguments, its standard output and error inherited,
/// sent to a log file or to pipes, and variables added to its environment; then poll, wait for or signal it.
/// The one fork/exec of trainkit: the launcher (`trainkit launch`) and `trainkit tune` both start their
/// children through it.
///
/// ```
/// Subprocess child(SubprocessOptions().argv({"/bin/echo", "hi"}).log_file("echo.log"));
/// const ExitStatus status = child.wait();  // status.ok()
/// ```

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>

namespace trainkit {

/// Environment variables as (name, value) pairs, in the order they are applied.
using Environment = std::vector<std::pair<std::string, std::string>>;

/// How a child process ended.
struct ExitStatus {
  int code = 0;    ///< the exit code (0..255) when it exited; 0 when a signal ended it
  int signal = 0;  ///< the signal that ended it; 0 when it exited
  /// Exited with code 0.
  bool ok() const { return signal == 0 && code == 0; }
  /// The shell's number for it: the exit code, or 128 + the signal.
  int shell_code() const { return signal != 0 ? 128 + signal : code; }
  /// "exited with code 3" or "was killed by signal 9 (Killed)".
  std::string to_string() const;
};

/// A helper process that kills (SIGKILL) the process groups registered with it once this process is gone
/// without removing them, however it ended: SIGKILL and the OOM killer included, which no handler of its
/// own sees. It is forked from this process, leaves its session (so that a signal to this process's group or
/// terminal does not reach it) and learns of this process's end as the end of file on a socket that only
/// this process holds. Subprocess registers a new_session child's group here while it runs
/// (SubprocessOptions::group_guard). Linux and POSIX; at most 4096 groups at a time.
class ProcessGroupGuard {
 public:
  /// Starts the helper. Throws std::runtime_error when the socket or the fork fails.
  ProcessGroupGuard();
  ProcessGroupGuard(const ProcessGroupGuard&) = delete;
  ProcessGroupGuard& operator=(const ProcessGroupGuard&) = delete;
  /// Closes the socket (the helper kills the groups still registered) and reaps the helper.
  ~ProcessGroupGuard();
  /// Registers process group `pgid` (> 0).
  void add(int64_t pgid);
  /// Forgets process group `pgid`: it has been dealt with.
  void remove(int64_t pgid);
  /// The helper's process id.
  int64_t pid() const { return pid_; }

 private:
  void send(int32_t message);
  int64_t pid_ = -1;
  int fd_ = -1;
};

/// Options of Subprocess: `SubprocessOptions().argv({exe, "train"}).log_file("train.log")`.
struct SubprocessOptions {
  /// The program and its arguments; argv[0] is looked up in PATH when it contains no '/'.
  TORCH_ARG(std::vector<std::string>, argv) = {};
  /// Standard output and error both go to this file, created or truncated; empty: both are inherited.
  TORCH_ARG(std::string, log_file) = "";
  /// Standard output and error go to two pipes whose read ends the parent takes with
  /// Subprocess::take_stdout() and take_stderr(). Not together with log_file.
  TORCH_ARG(bool, pipe_output) = false;
  /// Standard input comes from a pipe whose write end the parent takes with Subprocess::take_stdin()
  /// (closing it gives the child end of file); otherwise it is inherited.
  TORCH_ARG(bool, pipe_input) = false;
  /// Variables set in the child's environment, replacing inherited ones of the same name.
  TORCH_ARG(Environment, env) = {};
  /// Variables set in the child's environment only where it does not inherit them (defaults).
  TORCH_ARG(Environment, env_defaults) = {};
  /// Signal the child receives when the thread that started it ends (Linux PR_SET_PDEATHSIG, so that a
  /// killed parent takes its children along); 0: none. A child whose parent is already gone exits with 127.
  TORCH_ARG(int, parent_death_signal) = 0;
  /// The child calls setsid(): it leads a new session and process group (torchrun's start_new_session), out
  /// of reach of the terminal's and the parent group's signals. The group is then one job: kill() signals the
  /// whole group, and once poll(), wait() or the destructor has seen the child end, what is left of its group
  /// (processes it started) is killed with SIGKILL.
  TORCH_ARG(bool, new_session) = false;
  /// With new_session: the child's group is registered there while the child runs, so that it is killed
  /// even when this process is (see ProcessGroupGuard).
  TORCH_ARG(std::shared_ptr<ProcessGroupGuard>, group_guard) = nullptr;
  /// Runs in the child between fork and exec, e.g. to restore signal dispositions the parent changed.
  /// Only async-signal-safe calls belong there (no allocation, no locks, no logging).
  TORCH_ARG(std::function<void()>, before_exec) = {};
};

/// A started child process. Move-only; a default-constructed one holds no process. When the program
/// cannot be executed the child writes `cannot run 'PROGRAM': REASON` to its standard error and exits
/// with 127. Destroying a Subprocess whose child is still running kills it (SIGKILL) and reaps it.
/// Between fork and exec the child holds signals blocked and drops the handlers it copied from the parent,
/// so a signal sent to it early (kill() right after the start) acts as on the program.
class Subprocess {
 public:
  Subprocess() = default;
  /// Starts the child. Throws std::invalid_argument for an empty argv or log_file together with
  /// pipe_output; std::runtime_error naming the program (and the log file) when the log file cannot be
  /// opened or a pipe or the fork fails.
  explicit Subprocess(const SubprocessOptions& options);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  /// The child's process id; -1 when none was started.
  int64_t pid() const { return pid_; }
  /// Started and not yet reaped by poll() or wait().
  bool running() const { return pid_ > 0 && !status_; }
  /// How it ended once poll() or wait() has seen it end.
  const std::optional<ExitStatus>& status() const { return status_; }
  /// Without blocking: how the child ended, or nothing while it runs. Throws std::runtime_error when
  /// waitpid fails for another reason than an interruption.
  std::optional<ExitStatus> poll();
  /// Blocks until the child ends; returns how it ended (at once when it already has).
  ExitStatus wait();
  /// Sends `signal` to the child while it runs (to its whole process group with new_session); does nothing
  /// once it has been reaped.
  void kill(int signal) const;
  /// The read end of the child's standard output pipe (pipe_output); the caller owns it from then on
  /// and closes it. -1 without pipe_output or when already taken.
  int take_stdout();
  /// The read end of the child's standard error pipe, as take_stdout().
  int take_stderr();
  /// The write end of the child's standard input pipe (pipe_input), as take_stdout().
  int take_stdin();

 private:
  void release() noexcept;
  void ended(int status);  // records how it ended; kills and unregisters the rest of a new_session group
  int64_t pid_ = -1;
  bool new_session_ = false;
  std::shared_ptr<ProcessGroupGuard> group_guard_;
  std::optional<ExitStatus> status_;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
  int stdin_fd_ = -1;
};

}  // namespace trainkit
