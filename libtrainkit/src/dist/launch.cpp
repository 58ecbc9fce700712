#include "trainkit/dist/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

#include "trainkit/subprocess.h"

namespace trainkit::dist {

namespace {

volatile sig_atomic_t g_signal = 0;

extern "C" void on_signal(int sig) { g_signal = sig; }

struct Stream {
  int fd = -1;
  FILE* sink = nullptr;
  std::string pending;  // an incomplete line
};

struct Rank {
  Subprocess process;
  Stream out, err;
};

void emit(Stream& s, const std::string& prefix, const char* data, size_t n, bool flush_partial) {
  s.pending.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::fprintf(s.sink, "%s%.*s\n", prefix.c_str(), static_cast<int>(nl - start), s.pending.data() + start);
  }
  s.pending.erase(0, start);
  if (flush_partial && !s.pending.empty()) {
    std::fprintf(s.sink, "%s%s\n", prefix.c_str(), s.pending.c_str());
    s.pending.clear();
  }
  std::fflush(s.sink);
}

}  // namespace

int64_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("free_port: socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error(std::string("free_port: ") + std::strerror(e));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool port_is_free(int64_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as TCPStore: TIME_WAIT does not count
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

namespace {

/// How one attempt of the job ended.
struct Attempt {
  int failed_rank = -1;  ///< the first rank that failed, -1 when none did
  ExitStatus failed_status;
  int interrupted = 0;  ///< the signal that interrupted the launcher, 0 when none did
};

/// Starts every rank with restart count `restart`, forwards output and signals, and when one rank fails
/// stops the others; returns once every rank has exited.
/// The job-wide rank of this machine's `local`-th process.
int64_t global_rank(const LaunchOptions& options, size_t local) {
  return options.node_rank() * options.nproc() + static_cast<int64_t>(local);
}

Attempt run_ranks(const LaunchOptions& options, int64_t port, int64_t restart,
                  const std::shared_ptr<ProcessGroupGuard>& guard) {
  const auto n = static_cast<size_t>(options.nproc());

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction previous[3];
  const int forwarded[3] = {SIGINT, SIGTERM, SIGHUP};
  for (int k = 0; k < 3; ++k) sigaction(forwarded[k], &action, &previous[k]);
  g_signal = 0;

  std::vector<Rank> ranks(n);
  const std::string local_world = std::to_string(n);
  const std::string world = std::to_string(options.nnodes() * options.nproc());
  Environment defaults;
  if (options.omp_num_threads() > 0) {
    defaults.emplace_back("OMP_NUM_THREADS", std::to_string(options.omp_num_threads()));  // torchrun's default
  }
  for (size_t r = 0; r < n; ++r) {
    const std::string rank = std::to_string(global_rank(options, r));
    ranks[r].process = Subprocess(
        SubprocessOptions()
            .argv(options.command())
            .pipe_output(true)
            .env({{"RANK", rank}, {"LOCAL_RANK", std::to_string(r)}, {"ROLE_RANK", rank}, {"WORLD_SIZE", world},
                  {"LOCAL_WORLD_SIZE", local_world}, {"ROLE_WORLD_SIZE", world},
                  {"GROUP_RANK", std::to_string(options.node_rank())},
                  {"MASTER_ADDR", options.master_addr()}, {"MASTER_PORT", std::to_string(port)},
                  {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)},
                  {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options.max_restarts())}})
            .env_defaults(defaults)
            // Each rank leads its own process group, so that a signal reaches the processes it started too;
            // the guard kills the groups when the launcher dies (SIGKILL included), the parent-death signal
            // the rank itself should the guard be gone as well.
            .new_session(true)
            .group_guard(guard)
            .parent_death_signal(SIGKILL)
            .before_exec([&previous, &forwarded] {
              for (int k = 0; k < 3; ++k) sigaction(forwarded[k], &previous[k], nullptr);
            }));
    ranks[r].out = {ranks[r].process.take_stdout(), stdout, {}};
    ranks[r].err = {ranks[r].process.take_stderr(), stderr, {}};
  }

  using clock = std::chrono::steady_clock;
  int failed_rank = -1;
  ExitStatus failed_status;
  int interrupted = 0;
  bool stopping = false;
  clock::time_point kill_at{};
  clock::time_point all_exited_at{};
  auto signal_all = [&](int sig) {
    for (auto& rk : ranks) rk.process.kill(sig);
  };

  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, Stream*>> owners;
    for (size_t r = 0; r < n; ++r) {
      for (Stream* s : {&ranks[r].out, &ranks[r].err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(r, s);
        }
      }
    }
    bool any_running = false;
    for (auto& rk : ranks) any_running = any_running || rk.process.running();
    if (fds.empty() && !any_running) break;
    if (!any_running && all_exited_at == clock::time_point{}) all_exited_at = clock::now();
    if (!any_running && clock::now() - all_exited_at > std::chrono::seconds(1)) {
      // A process that left a rank's group (its own setsid) may keep the rank's output pipes open: stop
      // reading once the ranks are gone.
      for (auto& rk : ranks) {
        for (Stream* st : {&rk.out, &rk.err}) {
          if (st->fd >= 0) {
            const std::string prefix =
                options.prefix_output() ? "[rank " + std::to_string(global_rank(options, static_cast<size_t>(&rk - ranks.data()))) + "] " : "";
            emit(*st, prefix, "", 0, true);
            ::close(st->fd);
            st->fd = -1;
          }
        }
      }
      break;
    }
    if (!fds.empty()) {
      ::poll(fds.data(), fds.size(), 100);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    char buffer[65536];
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Stream& s = *owners[k].second;
      const std::string prefix = options.prefix_output() ? "[rank " + std::to_string(global_rank(options, owners[k].first)) + "] " : "";
      const ssize_t got = ::read(s.fd, buffer, sizeof(buffer));
      if (got > 0) {
        emit(s, prefix, buffer, static_cast<size_t>(got), false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        emit(s, prefix, buffer, 0, true);
        ::close(s.fd);
        s.fd = -1;
      }
    }
    for (size_t r = 0; r < n; ++r) {
      Subprocess& rk = ranks[r].process;
      if (!rk.running()) continue;
      const std::optional<ExitStatus> status = rk.poll();
      if (status && !status->ok() && failed_rank < 0 && !stopping) {
        failed_rank = static_cast<int>(global_rank(options, r));
        failed_status = *status;
        std::fprintf(stderr, "launch: rank %d (pid %lld) %s; stopping the other ranks\n", failed_rank,
                     static_cast<long long>(rk.pid()), status->to_string().c_str());
        std::fflush(stderr);
        stopping = true;
        signal_all(SIGTERM);
        kill_at = clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.grace_seconds() * 1000));
      }
    }
    if (g_signal != 0 && interrupted == 0) {
      interrupted = g_signal;
      signal_all(interrupted);  // forwarded as is to each rank's group; the ranks decide how to stop
      if (!stopping) {
        stopping = true;
        kill_at = clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.grace_seconds() * 1000));
      }
    }
    if (stopping && clock::now() > kill_at) {
      signal_all(SIGKILL);
      kill_at = clock::time_point::max();
    }
  }
  for (int k = 0; k < 3; ++k) sigaction(forwarded[k], &previous[k], nullptr);
  return {failed_rank, failed_status, interrupted};
}

}  // namespace

int launch(const LaunchOptions& options) {
  if (options.nproc() < 1) throw std::invalid_argument("launch: --nproc must be >= 1, got " + std::to_string(options.nproc()));
  if (options.command().empty()) throw std::invalid_argument("launch: no command to run (put it after --)");
  if (options.max_restarts() < 0) {
    throw std::invalid_argument("launch: --max-restarts must be >= 0, got " + std::to_string(options.max_restarts()));
  }
  if (options.nnodes() < 1) throw std::invalid_argument("launch: --nnodes must be >= 1, got " + std::to_string(options.nnodes()));
  if (options.node_rank() < 0 || options.node_rank() >= options.nnodes()) {
    throw std::invalid_argument("launch: --node-rank " + std::to_string(options.node_rank()) + " is not in 0.." +
                                std::to_string(options.nnodes() - 1) + " (--nnodes " + std::to_string(options.nnodes()) + ")");
  }
  if (options.nnodes() > 1 && options.master_port() == 0) {
    throw std::invalid_argument("launch: --master-port 0 (any free port) works on one machine only: with --nnodes " +
                                std::to_string(options.nnodes()) + " every machine must be given the same port");
  }
  if (options.nnodes() > 1 && options.max_restarts() > 0) {
    throw std::invalid_argument("launch: --max-restarts restarts the ranks of one machine; with --nnodes " +
                                std::to_string(options.nnodes()) +
                                " the other machines' launchers would not restart theirs (no elastic rendezvous)");
  }
  int64_t port = options.master_port();
  if (port == 0) {
    port = free_port();
  } else if (port < 1 || port > 65535) {
    throw std::invalid_argument("launch: --master-port " + std::to_string(port) + " is not in 1..65535");
  } else if (options.node_rank() == 0 && !port_is_free(port)) {  // node 0's rank 0 binds it
    throw std::invalid_argument("launch: --master-port " + std::to_string(port) +
                                " is already in use on this machine; choose another (or 0 for any free port)");
  }
  const auto n = static_cast<size_t>(options.nproc());
  const auto guard = std::make_shared<ProcessGroupGuard>();
  for (int64_t restart = 0;; ++restart) {
    const Attempt attempt = run_ranks(options, port, restart, guard);
    if (attempt.interrupted != 0) {
      std::fprintf(stderr, "launch: interrupted by signal %d (%s); forwarded to the ranks\n", attempt.interrupted,
                   strsignal(attempt.interrupted));
      return 128 + attempt.interrupted;
    }
    if (attempt.failed_rank < 0) {
      return 0;
    }
    if (restart == options.max_restarts()) {
      const std::string restarts = options.max_restarts() == 0 ? std::string()
                                                                : "; " + std::to_string(restart) + " of " +
                                                                      std::to_string(options.max_restarts()) +
                                                                      " restarts used";
      std::fprintf(stderr, "launch: failed: rank %d %s (of %zu ranks, MASTER_PORT %lld%s)\n", attempt.failed_rank,
                   attempt.failed_status.to_string().c_str(), n, static_cast<long long>(port), restarts.c_str());
      return 1;
    }
    std::fprintf(stderr, "launch: restarting all %zu ranks (restart %lld of %lld) after rank %d %s\n", n,
                 static_cast<long long>(restart + 1), static_cast<long long>(options.max_restarts()),
                 attempt.failed_rank, attempt.failed_status.to_string().c_str());
    std::fflush(stderr);
    // The next start binds the same rendezvous port: wait (up to 10 s) until rank 0's old store has let it go.
    for (int i = 0; i < 100 && !port_is_free(port); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

}  // namespace trainkit::dist
