// Subprocess, the one fork/exec of trainkit (the launcher and `trainkit tune` start their children with it):
// output to a log file or to pipes, environment additions and defaults, exit codes and signals, a program
// that cannot be run, and a running child killed when its Subprocess is destroyed.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "support.h"
#include "trainkit/subprocess.h"

using trainkit::ExitStatus;
using trainkit::ProcessGroupGuard;
using trainkit::Subprocess;
using trainkit::SubprocessOptions;
using trainkit::test::TempDir;
using Catch::Matchers::Contains;

namespace {

/// Everything left to read from `fd`, which is then closed.
std::string read_all(int fd) {
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

TEST_CASE("Subprocess sends output to a log file and reports the exit code", "[subprocess]") {
  TempDir tmp("subprocess-log");
  const std::string log = tmp.str("child.log");
  Subprocess child(SubprocessOptions().argv({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}).log_file(log));
  CHECK(child.pid() > 0);
  const ExitStatus status = child.wait();
  CHECK(status.code == 3);
  CHECK(status.signal == 0);
  CHECK_FALSE(status.ok());
  CHECK(status.shell_code() == 3);
  CHECK(status.to_string() == "exited with code 3");
  CHECK_FALSE(child.running());
  CHECK(trainkit::test::read_text(log) == "out\nerr\n");
}

TEST_CASE("Subprocess adds variables to the environment, defaults only where not inherited", "[subprocess]") {
  const char* path = std::getenv("PATH");
  REQUIRE(path != nullptr);
  ::setenv("TRAINKIT_TEST_REPLACED", "parent", 1);
  Subprocess child(SubprocessOptions()
                       .argv({"/bin/sh", "-c", "echo \"$TRAINKIT_TEST_REPLACED|$TRAINKIT_TEST_DEFAULT|$PATH\""})
                       .pipe_output(true)
                       .env({{"TRAINKIT_TEST_REPLACED", "child"}})
                       .env_defaults({{"TRAINKIT_TEST_DEFAULT", "2"}, {"PATH", "/nowhere"}}));
  const std::string out = read_all(child.take_stdout());
  ::unsetenv("TRAINKIT_TEST_REPLACED");
  CHECK(child.take_stdout() == -1);  // taken once
  CHECK(child.wait().ok());
  CHECK(out == std::string("child|2|") + path + "\n");
}

TEST_CASE("Subprocess takes its standard input from a pipe, end of file when the parent closes it",
          "[subprocess]") {
  // Without the pipe the child would read the test's own standard input; `wc -l` counts only what arrives.
  Subprocess child(SubprocessOptions().argv({"/bin/sh", "-c", "wc -l"}).pipe_input(true).pipe_output(true));
  const int in = child.take_stdin();
  REQUIRE(in >= 0);
  CHECK(child.take_stdin() == -1);  // taken once
  const std::string lines = "a\nb\nc\n";
  REQUIRE(::write(in, lines.data(), lines.size()) == static_cast<ssize_t>(lines.size()));
  ::close(in);
  const std::string out = read_all(child.take_stdout());
  CHECK(child.wait().ok());
  CHECK(out.find('3') != std::string::npos);
  CHECK(out.find_first_not_of(" \t3\n") == std::string::npos);
}

TEST_CASE("Subprocess polls, signals and names a program it cannot run", "[subprocess]") {
  SECTION("a signal") {
    Subprocess child(SubprocessOptions().argv({"sleep", "30"}));  // found in PATH
    CHECK_FALSE(child.poll().has_value());
    CHECK(child.running());
    child.kill(SIGTERM);
    const ExitStatus status = child.wait();
    CHECK(status.signal == SIGTERM);
    CHECK(status.shell_code() == 128 + SIGTERM);
    CHECK_THAT(status.to_string(), Contains("was killed by signal 15"));
    REQUIRE(child.poll().has_value());  // poll() after the end returns how it ended
    CHECK(child.poll()->signal == SIGTERM);
  }
  SECTION("a program that cannot be run: its error on the child's stderr, exit code 127") {
    Subprocess child(SubprocessOptions().argv({"./no-such-program", "x"}).pipe_output(true));
    const std::string err = read_all(child.take_stderr());
    CHECK_THAT(err, Contains("cannot run './no-such-program': "));
    CHECK(child.wait().code == 127);
  }
  SECTION("bad options") {
    CHECK_THROWS_AS(Subprocess(SubprocessOptions()), std::invalid_argument);
    CHECK_THROWS_AS(Subprocess(SubprocessOptions().argv({"/bin/true"}).log_file("x.log").pipe_output(true)),
                    std::invalid_argument);
    TempDir tmp("subprocess-bad-log");
    CHECK_THROWS_WITH(Subprocess(SubprocessOptions().argv({"/bin/true"}).log_file(tmp.str("no/such/dir/x.log"))),
                      Contains("cannot open its log file") && Contains("no/such/dir/x.log"));
  }
}

TEST_CASE("Destroying a Subprocess kills and reaps a child that still runs", "[subprocess]") {
  int64_t pid = -1;
  {
    Subprocess child(SubprocessOptions().argv({"sleep", "30"}));
    pid = child.pid();
    Subprocess moved = std::move(child);  // the process goes with the move
    CHECK_FALSE(child.running());
    CHECK(moved.running());
  }
  errno = 0;
  CHECK(::kill(static_cast<pid_t>(pid), 0) == -1);
  CHECK(errno == ESRCH);  // gone and reaped (a zombie would still accept signal 0)
}

namespace {

/// Whether `pid` has stopped running within 5 s (a SIGKILL is delivered asynchronously).
bool ends_soon(int64_t pid) {
  for (int i = 0; i < 250 && trainkit::test::process_runs(pid); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return !trainkit::test::process_runs(pid);
}

}  // namespace

TEST_CASE("new_session: the child leads its own group, which kill() reaches and which ends with it",
          "[subprocess]") {
  SECTION("what is left of the group when the child exits is killed") {
    Subprocess child(SubprocessOptions()
                         .argv({"/bin/sh", "-c", "sleep 300 > /dev/null 2>&1 & echo $!"})
                         .pipe_output(true)
                         .new_session(true));
    const int64_t sleep_pid = std::stoll(read_all(child.take_stdout()));
    CHECK(::getpgid(static_cast<pid_t>(sleep_pid)) == child.pid());
    CHECK(::getsid(static_cast<pid_t>(sleep_pid)) == child.pid());
    CHECK(child.wait().ok());
    const bool ended = ends_soon(sleep_pid);
    CHECK(ended);
    if (!ended) ::kill(static_cast<pid_t>(sleep_pid), SIGKILL);  // leave no sleep behind a failure
  }
  SECTION("kill() signals the whole group") {
    Subprocess child(SubprocessOptions()
                         .argv({"/bin/sh", "-c", "sleep 300 > /dev/null 2>&1 & trap '' TERM; echo $!; wait"})
                         .pipe_output(true)
                         .new_session(true));
    const int stdout_fd = child.take_stdout();
    std::string line;
    for (char c = 0; ::read(stdout_fd, &c, 1) == 1 && c != '\n';) line += c;
    ::close(stdout_fd);
    const int64_t sleep_pid = std::stoll(line);
    child.kill(SIGTERM);  // the shell ignores it (its sleep, started before the trap, does not) ...
    CHECK(ends_soon(sleep_pid));
    CHECK(child.wait().ok());  // ... and exits 0 once its `wait` sees the sleep gone
  }
}

TEST_CASE("ProcessGroupGuard kills the groups still registered when its owner lets go", "[subprocess]") {
  auto guard = std::make_shared<ProcessGroupGuard>();
  Subprocess kept(SubprocessOptions().argv({"sleep", "300"}).new_session(true));
  Subprocess killed(SubprocessOptions().argv({"sleep", "300"}).new_session(true));
  guard->add(kept.pid());
  guard->add(killed.pid());
  guard->remove(kept.pid());
  CHECK(trainkit::test::process_runs(guard->pid()));
  guard.reset();  // the helper sees the end of file as this process's death
  const bool ended = ends_soon(killed.pid());  // a zombie until wait() reaps it
  REQUIRE(ended);
  CHECK(killed.wait().signal == SIGKILL);
  CHECK(kept.running());
  CHECK_FALSE(kept.poll().has_value());
}

namespace {

volatile sig_atomic_t g_parent_saw_term = 0;

extern "C" void note_term(int) { g_parent_saw_term = 1; }

}  // namespace

TEST_CASE("A signal sent before the child's exec acts on the program, not on a handler copied from the parent",
          "[subprocess]") {
  struct sigaction action {};
  struct sigaction previous {};
  action.sa_handler = note_term;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, &previous);
  // Signalled at once, usually before its exec: with the parent's handler it would swallow the signal and
  // sleep on.
  Subprocess child(SubprocessOptions().argv({"sleep", "30"}));
  child.kill(SIGTERM);
  const bool ended = ends_soon(child.pid());  // a zombie until wait() reaps it
  ::sigaction(SIGTERM, &previous, nullptr);
  REQUIRE(ended);
  CHECK(child.wait().signal == SIGTERM);
  CHECK(g_parent_saw_term == 0);
}
