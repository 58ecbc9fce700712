#include "trainkit/subprocess.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace trainkit {
namespace {

// The child's environment, built in the parent: after fork only async-signal-safe calls are allowed, and
// setenv allocates.
std::vector<std::string> child_environment(const Environment& env, const Environment& defaults) {
  std::vector<std::string> out;
  auto find = [&out](const std::string& name) {
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].compare(0, name.size() + 1, name + "=") == 0) return static_cast<std::ptrdiff_t>(i);
    }
    return std::ptrdiff_t{-1};
  };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) out.emplace_back(*e);
  for (const auto& [name, value] : env) {
    const auto at = find(name);
    if (at >= 0) {
      out[static_cast<size_t>(at)] = name + "=" + value;
    } else {
      out.push_back(name + "=" + value);
    }
  }
  for (const auto& [name, value] : defaults) {
    if (find(name) < 0) out.push_back(name + "=" + value);
  }
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

ExitStatus exit_status(int status) {
  ExitStatus s;
  if (WIFSIGNALED(status)) {
    s.signal = WTERMSIG(status);
  } else {
    s.code = WEXITSTATUS(status);
  }
  return s;
}

void write_all(int fd, const char* text) {
  for (size_t left = std::strlen(text); left > 0;) {
    const ssize_t n = ::write(fd, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

// Waits for child `pid` to end (retrying on EINTR); its wait status.
int reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Signals process group `pgid`, or the process `pgid` itself while its setsid() has not run yet.
void signal_group(pid_t pgid, int signal) {
  if (::kill(-pgid, signal) != 0 && errno == ESRCH) ::kill(pgid, signal);
}

// The guard's helper, after fork: only async-signal-safe calls. Collects the registered groups from the
// socket (int32: +pgid registers, -pgid forgets) until end of file, then kills those left.
[[noreturn]] void guard_main(int fd) {
  ::setsid();
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::signal(sig, SIG_IGN);
  const int null = ::open("/dev/null", O_RDWR);
  for (int k = 0; k < 3; ++k) ::dup2(null, k);  // holds no pipe of the parent's open (a reader waits for EOF)
  for (int other = 3; other < 4096; ++other) {
    if (other != fd) ::close(other);
  }
  constexpr int kCapacity = 4096;
  pid_t groups[kCapacity];
  int count = 0;
  int32_t message = 0;
  size_t have = 0;  // bytes of `message` read so far
  for (;;) {
    const ssize_t got = ::read(fd, reinterpret_cast<char*>(&message) + have, sizeof(message) - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    have += static_cast<size_t>(got);
    if (have < sizeof(message)) continue;
    have = 0;
    if (message > 0 && count < kCapacity) {
      groups[count++] = message;
    } else if (message < 0) {
      for (int k = 0; k < count; ++k) {
        if (groups[k] == -message) {
          groups[k] = groups[--count];
          break;
        }
      }
    }
  }
  for (int k = 0; k < count; ++k) ::kill(-groups[k], SIGKILL);
  ::_exit(0);
}

}  // namespace

ProcessGroupGuard::ProcessGroupGuard() {
  int fds[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::runtime_error(std::string("ProcessGroupGuard: socketpair: ") + std::strerror(errno));
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw std::runtime_error(std::string("ProcessGroupGuard: fork: ") + std::strerror(e));
  }
  if (pid == 0) guard_main(fds[1]);
  ::close(fds[1]);
  pid_ = pid;
  fd_ = fds[0];
}

ProcessGroupGuard::~ProcessGroupGuard() {
  ::close(fd_);
  reap(static_cast<pid_t>(pid_));
}

void ProcessGroupGuard::add(int64_t pgid) { send(static_cast<int32_t>(pgid)); }

void ProcessGroupGuard::remove(int64_t pgid) { send(static_cast<int32_t>(-pgid)); }

void ProcessGroupGuard::send(int32_t message) {
  // MSG_NOSIGNAL: a helper that is gone must not take this process along with SIGPIPE.
  const char* data = reinterpret_cast<const char*>(&message);
  for (size_t left = sizeof(message); left > 0;) {
    const ssize_t n = ::send(fd_, data, left, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    left -= static_cast<size_t>(n);
  }
}

std::string ExitStatus::to_string() const {
  if (signal != 0) return "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return "exited with code " + std::to_string(code);
}

Subprocess::Subprocess(const SubprocessOptions& options) {
  if (options.argv().empty()) throw std::invalid_argument("Subprocess: argv is empty (no program to run)");
  const std::string program = options.argv().front();
  if (!options.log_file().empty() && options.pipe_output()) {
    throw std::invalid_argument("Subprocess: " + program + ": log_file and pipe_output exclude each other");
  }
  std::vector<std::string> args = options.argv();
  std::vector<std::string> env = child_environment(options.env(), options.env_defaults());
  std::vector<char*> argv = pointers(args);
  std::vector<char*> envp = pointers(env);
  const std::string exec_failed = "cannot run '" + program + "': ";

  int out_fd = -1;  // the child's standard output and error (write ends); the parent closes them
  int err_fd = -1;
  int out_pipe[2] = {-1, -1};
  int err_pipe[2] = {-1, -1};
  int in_pipe[2] = {-1, -1};
  auto close_all = [&] {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], in_pipe[0], in_pipe[1]}) {
      if (fd >= 0) ::close(fd);
    }
    if (!options.pipe_output() && out_fd >= 0) ::close(out_fd);
  };
  if (!options.log_file().empty()) {
    out_fd = ::open(options.log_file().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) {
      throw std::runtime_error(program + ": cannot open its log file " + options.log_file() + ": " +
                               std::strerror(errno));
    }
    err_fd = out_fd;
  } else if (options.pipe_output()) {
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
      const int e = errno;
      close_all();
      throw std::runtime_error(program + ": cannot create its output pipes: " + std::strerror(e));
    }
    out_fd = out_pipe[1];
    err_fd = err_pipe[1];
  }
  if (options.pipe_input() && ::pipe2(in_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    close_all();
    throw std::runtime_error(program + ": cannot create its input pipe: " + std::strerror(e));
  }

  std::fflush(stdout);  // what the parent printed so far comes before the child's output
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  // Signals stay blocked from fork until just before exec: one sent to the child in between (a forwarded
  // SIGTERM) then acts on it as on the program, instead of running a handler copied from the parent.
  sigset_t all_signals;
  sigset_t parent_mask;
  sigfillset(&all_signals);
  pthread_sigmask(SIG_SETMASK, &all_signals, &parent_mask);
  const pid_t pid = ::fork();
  if (pid != 0) pthread_sigmask(SIG_SETMASK, &parent_mask, nullptr);
  if (pid < 0) {
    const int e = errno;
    close_all();
    throw std::runtime_error(program + ": cannot start: fork: " + std::strerror(e));
  }
  if (pid == 0) {
    if (options.new_session()) ::setsid();
    if (options.parent_death_signal() != 0) {
      ::prctl(PR_SET_PDEATHSIG, options.parent_death_signal());
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    }
    if (out_fd >= 0) {
      ::dup2(out_fd, STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copies
      ::dup2(err_fd, STDERR_FILENO);
    }
    if (in_pipe[0] >= 0) ::dup2(in_pipe[0], STDIN_FILENO);
    if (options.before_exec()) options.before_exec()();
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction action {};
      if (::sigaction(sig, nullptr, &action) == 0 && action.sa_handler != SIG_DFL && action.sa_handler != SIG_IGN) {
        ::signal(sig, SIG_DFL);
      }
    }
    pthread_sigmask(SIG_SETMASK, &parent_mask, nullptr);
    ::execvpe(argv[0], argv.data(), envp.data());
    write_all(STDERR_FILENO, exec_failed.c_str());
    write_all(STDERR_FILENO, std::strerror(errno));
    write_all(STDERR_FILENO, "\n");
    ::_exit(127);
  }
  pid_ = pid;
  new_session_ = options.new_session();
  if (new_session_ && options.group_guard()) {
    group_guard_ = options.group_guard();
    group_guard_->add(pid_);
  }
  if (options.pipe_output()) {
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    stdout_fd_ = out_pipe[0];
    stderr_fd_ = err_pipe[0];
  } else if (out_fd >= 0) {
    ::close(out_fd);
  }
  if (options.pipe_input()) {
    ::close(in_pipe[0]);
    stdin_fd_ = in_pipe[1];
  }
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_),
      new_session_(other.new_session_),
      group_guard_(std::move(other.group_guard_)),
      status_(other.status_),
      stdout_fd_(other.stdout_fd_),
      stderr_fd_(other.stderr_fd_),
      stdin_fd_(other.stdin_fd_) {
  other.pid_ = -1;
  other.status_.reset();
  other.stdout_fd_ = other.stderr_fd_ = other.stdin_fd_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    release();
    pid_ = other.pid_;
    new_session_ = other.new_session_;
    group_guard_ = std::move(other.group_guard_);
    status_ = other.status_;
    stdout_fd_ = other.stdout_fd_;
    stderr_fd_ = other.stderr_fd_;
    stdin_fd_ = other.stdin_fd_;
    other.pid_ = -1;
    other.status_.reset();
    other.stdout_fd_ = other.stderr_fd_ = other.stdin_fd_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() { release(); }

void Subprocess::release() noexcept {
  if (running()) {
    kill(SIGKILL);
    ended(reap(static_cast<pid_t>(pid_)));
  }
  group_guard_.reset();
  for (int* fd : {&stdin_fd_, &stdout_fd_, &stderr_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  pid_ = -1;
  status_.reset();
}

std::optional<ExitStatus> Subprocess::poll() {
  if (!running()) return status_;
  int status = 0;
  const pid_t done = ::waitpid(static_cast<pid_t>(pid_), &status, WNOHANG);
  if (done == 0 || (done < 0 && errno == EINTR)) return std::nullopt;
  if (done < 0) {
    throw std::runtime_error("waitpid for process " + std::to_string(pid_) + ": " + std::strerror(errno));
  }
  ended(status);
  return status_;
}

void Subprocess::ended(int status) {
  status_ = exit_status(status);
  if (!new_session_) return;
  // The group's id stays taken while any member lives, so this reaches the child's own processes only.
  ::kill(-static_cast<pid_t>(pid_), SIGKILL);
  if (group_guard_) group_guard_->remove(pid_);
}

ExitStatus Subprocess::wait() {
  if (pid_ <= 0) throw std::logic_error("Subprocess::wait: no process was started");
  while (running()) {
    int status = 0;
    const pid_t done = ::waitpid(static_cast<pid_t>(pid_), &status, 0);
    if (done == static_cast<pid_t>(pid_)) {
      ended(status);
    } else if (done < 0 && errno != EINTR) {
      throw std::runtime_error("waitpid for process " + std::to_string(pid_) + ": " + std::strerror(errno));
    }
  }
  return *status_;
}

void Subprocess::kill(int signal) const {
  if (!running()) return;
  if (new_session_) {
    signal_group(static_cast<pid_t>(pid_), signal);
  } else {
    ::kill(static_cast<pid_t>(pid_), signal);
  }
}

int Subprocess::take_stdout() { return std::exchange(stdout_fd_, -1); }

int Subprocess::take_stderr() { return std::exchange(stderr_fd_, -1); }

int Subprocess::take_stdin() { return std::exchange(stdin_fd_, -1); }

}  // namespace trainkit
