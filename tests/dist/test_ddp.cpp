// Distributed data parallel, ZeRO-1 and the launcher, in several processes on loopback: each multi-process
// test runs `trainkit launch` (or the ranks by hand) with tests/dist/dist_worker.cpp and compares what the
// ranks wrote with the same training done here in one process on the full batch.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "dist/dist_common.h"
#include "support.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/launch.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/dist/zero.h"
#include "trainkit/subprocess.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/trainer.h"

using Catch::Matchers::Contains;
using trainkit::test::TempDir;
using trainkit::test::process_runs;
using trainkit::test::read_text;
using trainkit::test::WhatContains;
namespace td = trainkit::test::dist;

namespace {

struct Run {
  int code;
  std::string output;
};

/// Runs a shell command line, capturing stdout and stderr.
Run shell(const std::string& command, const TempDir& tmp, const std::string& name = "output.txt") {
  const std::string log = tmp.str(name);
  const int status = std::system((command + " > " + log + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
}

/// `trainkit launch --nproc 2 --master-port 0 -- dist_worker ARGS`.
/// The launcher runs under `timeout -s KILL 300`, a guard against a hang only (exit code 137 then).
Run launch_worker(const std::string& args, const TempDir& tmp, const std::string& env = "") {
  return shell(env + " timeout -s KILL 300 " + std::string(TRAINKIT_CLI_PATH) + " launch --nproc 2 --master-port 0 -- " +
                   TRAINKIT_DIST_WORKER_PATH + " " + args,
               tmp);
}

std::vector<at::Tensor> load_params(const std::string& path) {
  std::vector<at::Tensor> params;
  torch::load(params, path);
  return params;
}

double max_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

/// One process, full batch (world * accum * micro rows per step): what 2-rank DDP must reproduce.
std::vector<at::Tensor> reference(int64_t steps, int64_t world, int64_t accum, bool adam, int64_t* state_bytes = nullptr) {
  auto net = td::make_chain_net(7);
  const auto data = td::make_data(steps * world * accum * td::kMicro);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (adam) {
    opt = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
  } else {
    opt = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(td::kLr).momentum(0.9));
  }
  const int64_t global = world * accum * td::kMicro;
  for (int64_t s = 0; s < steps; ++s) {
    opt->zero_grad();
    torch::nn::functional::cross_entropy(net->forward(data.first.narrow(0, s * global, global)),
                                         data.second.narrow(0, s * global, global))
        .backward();
    opt->step();
  }
  if (state_bytes != nullptr) *state_bytes = trainkit::dist::optimizer_state_bytes(*opt);
  return td::snapshot(*net);
}

/// Holds a listening socket on some port, so that the port is in use.
class BusyPort {
 public:
  BusyPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(addr);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd_, 1) == 0);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
  }
  ~BusyPort() { ::close(fd_); }
  int64_t port() const { return port_; }

 private:
  int fd_ = -1;
  int64_t port_ = 0;
};

/// Sets environment variables for a scope and restores them.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TRAINKIT_DIST_TIMEOUT",
                             "TRAINKIT_DIST_BACKEND"}) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name);
    }
    for (const auto& [k, v] : vars) ::setenv(k, v, 1);
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) {
        ::setenv(k.c_str(), v->c_str(), 1);
      } else {
        ::unsetenv(k.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace

TEST_CASE("2-rank DDP equals one process on the full batch", "[dist][ddp]") {
  struct Variant {
    const char* name;
    const char* args;
    int64_t accum;
  };
  for (const Variant& v : {Variant{"overlapped buckets", "", 1}, Variant{"no_sync accumulation", "", 2},
                           Variant{"all-reduce after backward", "--no-overlap", 1}}) {
    DYNAMIC_SECTION(v.name) {
      TempDir tmp("ddp");
      const int64_t steps = 4;
      const Run run = launch_worker("--mode ddp --steps 4 --bucket-kb 1 --accum " + std::to_string(v.accum) + " " +
                                        v.args + " --out " + tmp.str(),
                                    tmp);
      INFO(run.output);
      REQUIRE(run.code == 0);
      // 13 layers of 8x8+8 float64 (576 B) and a head: a 1 KiB cap makes 6 buckets (two layers each, the head with one).
      CHECK_THAT(run.output, Contains("[rank 0] rank 0: buckets 6"));
      CHECK_THAT(run.output, Contains("[rank 1] rank 1: buckets 6"));
      // Every step all-reduces the 6 buckets once, in its last micro-batch, carrying every parameter's
      // gradient once (12 hidden layers of 576 B + the head's 8x3+3 doubles, 216 B); the no_sync micro-batches send
      // nothing. Averaging after every micro-batch would give the same parameters (linearity), so only
      // these counts show that no_sync works.
      const std::string sync_counts = std::to_string(steps * 6) + " (" + std::to_string(steps * (12 * 576 + 216)) + " bytes) synchronising";
      for (const char* r : {"[rank 0] rank 0", "[rank 1] rank 1"}) {
        CHECK_THAT(run.output, Contains(std::string(r) + ": backward all-reduces: 0 (0 bytes) under no_sync, " + sync_counts));
      }
      if (std::string(v.args).empty()) {
        // All but the bucket holding the first layer start while backward still runs.
        CHECK_THAT(run.output, Contains("started during backward 5"));
      } else {
        CHECK_THAT(run.output, Contains("started during backward 0"));
      }
      const auto rank0 = load_params(tmp.str("rank0.pt"));
      const auto rank1 = load_params(tmp.str("rank1.pt"));
      CHECK(max_diff(rank0, rank1) == 0.0);
      const auto expected = reference(steps, 2, v.accum, false);
      CHECK(max_diff(rank0, expected) <= 1e-10);
      // The test can fail: the initial parameters differ from the trained ones by far more.
      CHECK(max_diff(td::snapshot(*td::make_chain_net(7)), expected) > 1e-3);
    }
  }
}

TEST_CASE("2-rank DDP with fp16/bf16 gradient compression stays close to the exact run", "[dist][ddp]") {
  for (const char* compression : {"fp16", "bf16"}) {
    DYNAMIC_SECTION(compression) {
      TempDir tmp("ddp-compress");
      const Run run = launch_worker(
          "--mode ddp --steps 4 --bucket-kb 1 --compression " + std::string(compression) + " --out " + tmp.str(), tmp);
      INFO(run.output);
      REQUIRE(run.code == 0);
      const auto rank0 = load_params(tmp.str("rank0.pt"));
      CHECK(max_diff(rank0, load_params(tmp.str("rank1.pt"))) == 0.0);
      const double d = max_diff(rank0, reference(4, 2, 1, false));
      CHECK(d > 0.0);  // compression does round
      CHECK(d < (std::string(compression) == "fp16" ? 1e-3 : 1e-2));
    }
  }
}

TEST_CASE("2-rank DDP: a parameter without gradient is an error, or zero with find_unused_parameters",
          "[dist][ddp]") {
  TempDir tmp("ddp-unused");
  const Run strict = launch_worker("--mode unused --steps 2 --out " + tmp.str(), tmp, "TRAINKIT_DIST_TIMEOUT=5");
  INFO(strict.output);
  CHECK(strict.code != 0);
  CHECK_THAT(strict.output, Contains("2 parameter(s) got no gradient in this backward: extra.weight, extra.bias"));
  CHECK_THAT(strict.output, Contains("find_unused_parameters(true)"));
  const Run lenient = launch_worker("--mode unused --find-unused --steps 4 --bucket-kb 1 --out " + tmp.str(), tmp);
  INFO(lenient.output);
  REQUIRE(lenient.code == 0);
  auto rank0 = load_params(tmp.str("rank0.pt"));
  REQUIRE(rank0.size() == 28);
  rank0.resize(26);  // the chain's parameters: as if the extra layer did not exist
  CHECK(max_diff(rank0, reference(4, 2, 1, false)) <= 1e-10);
}

TEST_CASE("2-rank DDP with a GradScaler: an inf on one rank makes every rank skip the step", "[dist][ddp]") {
  TempDir tmp("ddp-scaler");
  const Run run = launch_worker("--mode scaler --steps 5 --bucket-kb 1 --out " + tmp.str(), tmp);
  INFO(run.output);
  REQUIRE(run.code == 0);
  // Only rank 1's loss was inf, but the averaged gradients carry it to rank 0 too.
  CHECK_THAT(run.output, Contains("[rank 0] rank 0: skipped steps: 2; scale 512"));
  CHECK_THAT(run.output, Contains("[rank 1] rank 1: skipped steps: 2; scale 512"));
  CHECK(max_diff(load_params(tmp.str("rank0.pt")), load_params(tmp.str("rank1.pt"))) == 0.0);
}

TEST_CASE("ZeRO-1 over 2 ranks equals the unsharded optimizer", "[dist][zero]") {
  TempDir tmp("zero");
  const Run run = launch_worker("--mode zero --steps 4 --bucket-kb 1 --out " + tmp.str(), tmp);
  INFO(run.output);
  REQUIRE(run.code == 0);
  int64_t full_bytes = 0;
  const auto expected = reference(4, 2, 1, true, &full_bytes);
  const auto rank0 = load_params(tmp.str("rank0.pt"));
  CHECK(max_diff(rank0, load_params(tmp.str("rank1.pt"))) == 0.0);
  CHECK(max_diff(rank0, expected) <= 1e-10);
  CHECK_THAT(run.output, Contains("[rank 0] rank 0: zero checkpoint round trip equal"));
  CHECK_THAT(run.output, Contains("[rank 1] rank 1: zero checkpoint round trip equal"));
  // Each rank holds about half of Adam's state; the two shards add up to the whole.
  int64_t sum = 0;
  for (int r = 0; r < 2; ++r) {
    const std::string key = "[rank " + std::to_string(r) + "] rank " + std::to_string(r) + ": optimizer state ";
    const auto at = run.output.find(key);
    REQUIRE(at != std::string::npos);
    const int64_t bytes = std::stoll(run.output.substr(at + key.size()));
    CHECK(bytes < full_bytes * 6 / 10);
    sum += bytes;
  }
  // Adam's per-parameter state (exp_avg, exp_avg_sq) splits exactly; each shard keeps its own step counts.
  CHECK(sum >= full_bytes);
  CHECK(sum <= full_bytes + 64 * 8);
}

TEST_CASE("Helpers: barrier, mean over ranks, broadcast", "[dist][env]") {
  TempDir tmp("env");
  const Run run = launch_worker("--mode env", tmp);
  INFO(run.output);
  REQUIRE(run.code == 0);
  CHECK_THAT(run.output, Contains("[rank 0] rank 0 of 2: mean 0.500 broadcast 100.0 pair 0.500 2.000 backend gloo"));
  CHECK_THAT(run.output, Contains("[rank 1] rank 1 of 2: mean 0.500 broadcast 100.0 pair 0.500 2.000 backend gloo"));
}

TEST_CASE("A rank that dies makes the others fail fast, naming the collective", "[dist][fault]") {
  TempDir tmp("fault");
  for (const char* mode : {"fault", "hang"}) {
    DYNAMIC_SECTION(mode) {
      // The ranks by hand, so that the surviving rank's own exit is observed (the launcher would stop it).
      const std::string port = std::to_string(trainkit::dist::free_port());
      const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " WORLD_SIZE=2 TRAINKIT_DIST_TIMEOUT=3 ";
      const std::string worker = std::string(TRAINKIT_DIST_WORKER_PATH) + " --mode " + mode + " --out " + tmp.str();
      const std::string script = "( " + env + "RANK=0 timeout -s KILL 60 " + worker + " > " + tmp.str("rank0.txt") +
                                 " 2>&1 & p0=$!; " + env + "RANK=1 timeout -s KILL 60 " + worker + " > " +
                                 tmp.str("rank1.txt") + " 2>&1 & p1=$!; wait $p0; c0=$?; kill -KILL $p1 2>/dev/null;" +
                                 " wait $p1; exit $c0 )";
      const Run run = shell("sh -c '" + script + "'", tmp);
      const std::string rank0 = read_text(tmp.str("rank0.txt"));
      INFO(rank0 << read_text(tmp.str("rank1.txt")));
      CHECK(run.code == 3);
      CHECK_THAT(rank0, Contains("dist_worker: rank 0:"));
      CHECK_THAT(rank0, Contains("all_reduce"));
      CHECK_THAT(rank0, Contains("failed"));
      // No wall-time assertion (CI's cores are busy): `timeout -s KILL 60` guards against a hang, and exit
      // code 3 (not 137) shows that rank 0 ended by itself, on the collective's error.
      // The last checkpoint rank 0 wrote still loads.
      torch::serialize::InputArchive archive;
      trainkit::train::load_checkpoint(tmp.str("last.pt"), archive);
      auto net = td::make_chain_net(0);
      net->load(archive);
      at::Tensor step;
      archive.read("step", step);
      CHECK(step.item<int64_t>() >= 5);
    }
  }
}

TEST_CASE("The launcher stops the others and names the failing rank", "[dist][launch]") {
  TempDir tmp("launch-fault");
  const Run run = launch_worker("--mode fault --out " + tmp.str(), tmp, "TRAINKIT_DIST_TIMEOUT=3");
  INFO(run.output);
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Contains("launch: rank 1 (pid"));
  CHECK_THAT(run.output, Contains("killed by signal 9"));
  CHECK_THAT(run.output, Contains("launch: failed: rank 1"));
  // Exit code 1 (not the hang guard's 137): the launcher stopped the other rank and returned by itself.
}

TEST_CASE("The launcher forwards SIGTERM to the ranks", "[dist][launch]") {
  TempDir tmp("launch-signal");
  const std::string rank_cmd = "trap \"echo got TERM; exit 7\" TERM; echo ready; while :; do sleep 0.1; done";
  // The SIGTERM must reach the launcher itself, so no `timeout` wraps it here (timeout would signal the
  // whole process group, ranks included); ctest's per-test TIMEOUT is the hang guard.
  // The signal is sent once both ranks have said "ready" (the launcher installs its handlers before it starts
  // them, the ranks their trap before they print), not after a fixed delay that a loaded machine can outlast.
  const std::string out = tmp.str("launch.out");
  const Run run = shell("{ " + std::string(TRAINKIT_CLI_PATH) + " launch --nproc 2 --master-port 0 -- sh -c '" +
                            rank_cmd + "' > " + out + " 2>&1 & p=$!; n=0; while [ \"$(grep -c ' ready' " + out +
                            ")\" != 2 ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done; kill -TERM $p; wait $p; "
                            "echo launcher exit $?; cat " + out + "; }",
                        tmp);
  INFO(run.output);
  CHECK_THAT(run.output, Contains("[rank 0] got TERM"));
  CHECK_THAT(run.output, Contains("[rank 1] got TERM"));
  CHECK_THAT(run.output, Contains("launch: interrupted by signal 15"));
  CHECK_THAT(run.output, Contains("launcher exit 143"));
}

TEST_CASE("A SIGKILLed launcher takes its ranks and the processes they started along", "[dist][launch]") {
  TempDir tmp("launch-groups");
  // Each rank (a shell) starts `sleep 300` in the background, records its own pid and the sleep's, and waits.
  const std::string dir = tmp.str();
  const std::string rank_cmd = "sleep 300 & echo $! > " + dir + "/child$RANK.tmp; echo $$ > " + dir +
                               "/rank$RANK.tmp; mv " + dir + "/child$RANK.tmp " + dir + "/child$RANK; mv " + dir +
                               "/rank$RANK.tmp " + dir + "/rank$RANK; wait";
  trainkit::Subprocess launcher(trainkit::SubprocessOptions()
                                    .argv({TRAINKIT_CLI_PATH, "launch", "--nproc", "2", "--master-port", "0", "--",
                                           "sh", "-c", rank_cmd})
                                    .log_file(tmp.str("launch.out")));
  const std::vector<std::string> names = {"rank0", "rank1", "child0", "child1"};
  const auto all_recorded = [&] {
    for (const auto& name : names) {
      if (!std::filesystem::exists(tmp.str(name))) return false;
    }
    return true;
  };
  for (int i = 0; i < 1200 && !all_recorded() && launcher.running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    launcher.poll();
  }
  INFO(read_text(tmp.str("launch.out")));
  REQUIRE(all_recorded());
  std::vector<int64_t> pids;
  for (const auto& name : names) pids.push_back(std::stoll(read_text(tmp.str(name))));
  for (int64_t pid : pids) CHECK(process_runs(pid));
  std::vector<int64_t> must_end = pids;
  SECTION("the launcher: its guard kills the ranks' groups") {
    CHECK(launcher.running());
    launcher.kill(SIGKILL);
  }
  SECTION("the launcher and its guard at once: the ranks end by their parent-death signal") {
    // The launcher's children are the two ranks and the guard; the ranks' sleeps are out of reach then.
    const std::string launcher_pid = std::to_string(launcher.pid());
    std::istringstream children(read_text("/proc/" + launcher_pid + "/task/" + launcher_pid + "/children"));
    int64_t guard = -1;
    for (int64_t child = 0; children >> child;) {
      if (child != pids[0] && child != pids[1]) guard = child;
    }
    REQUIRE(guard > 0);
    ::kill(static_cast<pid_t>(guard), SIGKILL);
    launcher.kill(SIGKILL);
    must_end = {pids[0], pids[1]};
  }
  CHECK(launcher.wait().signal == SIGKILL);
  // Within 5 s no process of the run is left: not the ranks, not their sleeps.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  const auto left = [&] {
    std::vector<int64_t> out;
    for (int64_t pid : must_end) {
      if (process_runs(pid)) out.push_back(pid);
    }
    return out;
  };
  while (!left().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(left().empty());
  for (int64_t pid : pids) {
    if (process_runs(pid)) ::kill(static_cast<pid_t>(pid), SIGKILL);  // leave no sleep behind (or a failure)
  }
}

TEST_CASE("Launcher: bad input", "[dist][launch]") {
  using trainkit::dist::LaunchOptions;
  CHECK_THROWS_WITH(trainkit::dist::launch(LaunchOptions().nproc(0).command({"true"})), Contains("--nproc"));
  CHECK_THROWS_WITH(trainkit::dist::launch(LaunchOptions().nproc(2)), Contains("no command"));
  BusyPort busy;
  CHECK_THROWS_WITH(trainkit::dist::launch(LaunchOptions().nproc(2).master_port(busy.port()).command({"true"})),
                    Contains("--master-port " + std::to_string(busy.port()) + " is already in use"));
  TempDir tmp("launch-bad");
  const Run missing = shell(std::string(TRAINKIT_CLI_PATH) + " launch --nproc 2 --master-port 0 -- ./no-such-program", tmp);
  CHECK(missing.code == 1);
  CHECK_THAT(missing.output, Contains("cannot run './no-such-program'"));
  CHECK_THAT(missing.output, Contains("launch: failed: rank"));
  const Run usage = shell(std::string(TRAINKIT_CLI_PATH) + " launch --nproc 2", tmp);
  CHECK(usage.code == 2);
  CHECK_THAT(usage.output, Contains("no command"));
}

TEST_CASE("Launcher on several machines: node K's ranks are K * nproc + local, bad node options refused",
          "[dist][launch]") {
  using trainkit::dist::LaunchOptions;
  TempDir tmp("launch-nodes");
  // Node 1 of 2 with 2 processes each: ranks 2 and 3 of 4, local ranks 0 and 1. Its ranks need no rank 0 to
  // print their environment, and node 1 does not bind the port (node 0's rank 0 does).
  const Run run = shell(std::string(TRAINKIT_CLI_PATH) + " launch --nnodes 2 --node-rank 1 --nproc 2 --master-addr "
                            "10.1.2.3 --master-port 29777 -- sh -c 'echo R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE "
                            "LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK A=$MASTER_ADDR:$MASTER_PORT'",
                        tmp);
  INFO(run.output);
  REQUIRE(run.code == 0);
  CHECK_THAT(run.output, Contains("[rank 2] R=2 L=0 W=4 LW=2 G=1 A=10.1.2.3:29777"));
  CHECK_THAT(run.output, Contains("[rank 3] R=3 L=1 W=4 LW=2 G=1 A=10.1.2.3:29777"));
  const auto two_nodes = [] { return LaunchOptions().nnodes(2).nproc(1).master_port(29777).command({"true"}); };
  CHECK_THROWS_WITH(trainkit::dist::launch(two_nodes().node_rank(2)), Contains("--node-rank 2 is not in 0..1"));
  CHECK_THROWS_WITH(trainkit::dist::launch(two_nodes().node_rank(-1)), Contains("--node-rank -1 is not in 0..1"));
  CHECK_THROWS_WITH(trainkit::dist::launch(two_nodes().master_port(0)),
                    Contains("--master-port 0 (any free port) works on one machine only"));
  CHECK_THROWS_WITH(trainkit::dist::launch(two_nodes().max_restarts(1)), Contains("no elastic rendezvous"));
  CHECK_THROWS_WITH(trainkit::dist::launch(LaunchOptions().nnodes(0).command({"true"})), Contains("--nnodes must be >= 1"));
}

TEST_CASE("Process group: bad environment and port in use", "[dist][env]") {
  using trainkit::dist::DistError;
  {
    ScopedEnv env({});
    const auto options = trainkit::dist::options_from_env();
    CHECK(options.world_size() == 1);
    auto pg = trainkit::dist::ProcessGroup::from_env();
    CHECK(pg->world_size() == 1);
    CHECK(pg->all_reduce_mean(2.5) == 2.5);
    CHECK(pg->backend_name(c10::kCPU) == "none");
  }
  {
    ScopedEnv env({{"RANK", "1"}});
    CHECK_THROWS_MATCHES(trainkit::dist::options_from_env(), DistError, WhatContains("WORLD_SIZE is not"));
  }
  {
    ScopedEnv env({{"WORLD_SIZE", "2"}});
    CHECK_THROWS_MATCHES(trainkit::dist::options_from_env(), DistError, WhatContains("RANK is not"));
  }
  {
    ScopedEnv env({{"WORLD_SIZE", "two"}, {"RANK", "0"}});
    CHECK_THROWS_MATCHES(trainkit::dist::options_from_env(), DistError, WhatContains("WORLD_SIZE='two' is not an integer"));
  }
  {
    ScopedEnv env({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_PORT", "29500"}});
    CHECK_THROWS_MATCHES(trainkit::dist::options_from_env(), DistError, WhatContains("MASTER_ADDR is not set"));
  }
  {
    ScopedEnv env({{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
    CHECK_THROWS_MATCHES(trainkit::dist::ProcessGroup::from_env(), DistError,
                         WhatContains("RANK=2 is not in [0, WORLD_SIZE=2)"));
  }
  {
    ScopedEnv env({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
                   {"TRAINKIT_DIST_TIMEOUT", "-1"}});
    CHECK_THROWS_MATCHES(trainkit::dist::options_from_env(), DistError, WhatContains("TRAINKIT_DIST_TIMEOUT='-1'"));
  }
  CHECK_THROWS_MATCHES(trainkit::dist::ProcessGroup::init(trainkit::dist::InitOptions().world_size(2).backend("mpi")),
                       DistError, WhatContains("unknown distributed backend 'mpi'"));
  BusyPort busy;
  CHECK_THROWS_MATCHES(trainkit::dist::ProcessGroup::init(trainkit::dist::InitOptions()
                                                              .world_size(2)
                                                              .rank(0)
                                                              .master_port(busy.port())
                                                              .timeout(std::chrono::milliseconds(2000))),
                       DistError, WhatContains("cannot host the TCPStore on port " + std::to_string(busy.port())));
}

TEST_CASE("Process group: a backend per device type, as PyTorch's \"cpu:gloo,cuda:nccl\"", "[dist][env]") {
  using trainkit::dist::DistError;
  using trainkit::dist::InitOptions;
  using trainkit::dist::ProcessGroup;
  // The PyTorch spelling and its parts (this LibTorch has NCCL compiled in: a world of one makes no backend).
  for (const char* spec : {"nccl", "cpu:gloo,cuda:nccl", "cuda:nccl", "cuda:nccl,cpu:gloo", " cpu:gloo , cuda:nccl ",
                           "cpu:gloo", "gloo", "auto"}) {
    INFO(spec);
    CHECK_NOTHROW(ProcessGroup::init(InitOptions().backend(spec)));
  }
  // A bad part is named.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"cpu:nccl", "'cpu:nccl': CPU tensors go to gloo (NCCL cannot carry CPU tensors)"},
      {"cpu:gloo,cuda:mpi", "'cuda:mpi': unknown backend 'mpi'"},
      {"cpu:gloo,tpu:gloo", "'tpu:gloo' names no device type"},
      {"cpu:gloo,cuda", "'cuda' is not <device>:<backend>"},
      {"cuda:nccl,cuda:nccl", "'cuda:nccl': a group has one device backend, and 'nccl' for cuda came first"},
      {"cpu:gloo,", "'' is not <device>:<backend>"},
      {"mpi", "unknown distributed backend 'mpi'"},
  };
  for (const auto& [spec, message] : bad) {
    INFO(spec);
    CHECK_THROWS_MATCHES(ProcessGroup::init(InitOptions().backend(spec)), DistError, WhatContains(message));
  }
}

TEST_CASE("An nccl-style group (its device backend refuses CPU tensors) runs the CPU-side collectives through Gloo, "
          "and ZeRO-2's clip and found-inf reduction on the device",
          "[dist][env][zero]") {
  // dist_worker's "refuse_cpu" wraps Gloo and throws on any CPU tensor, as NCCL does; "testdev:refuse_cpu"
  // names it alone, as backend = "nccl" names NCCL alone: Gloo for CPU tensors must come with it.
  TempDir tmp("nccl-style");
  const Run run = launch_worker("--mode nccl_style", tmp, "env TRAINKIT_DIST_BACKEND=testdev:refuse_cpu TRAINKIT_DIST_TIMEOUT=20");
  INFO(run.output);
  REQUIRE(run.code == 0);
  for (int rank : {0, 1}) {
    const std::string r = "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) + ": ";
    CHECK_THAT(run.output, Contains(r + "backends cpu gloo, testdev refuse_cpu"));
    // barrier, all_reduce_mean, all_reduce_sum, broadcast_value and a CPU tensor's all-reduce: all through
    // Gloo, none reached the device backend.
    CHECK_THAT(run.output, Contains(r + "cpu-side mean 0.500 sum 3.000 broadcast 100.0 cpu all_reduce 9.000; device "
                                        "backend served 0"));
    // A device tensor goes to the device backend (the test would not notice a backend never used otherwise).
    CHECK_THAT(run.output, Contains(r + "device all_reduce 9.000 on testdev:0; device backend calls 1"));
    // The clip's norm over both shards, reduced on the device: one all-reduce, carried by the device backend.
    const std::regex clip(std::regex_replace(r, std::regex(R"([\[\]])"), R"(\$&)") +
                          R"(zero2 clip norm ([0-9.]+) expected ([0-9.]+) on testdev:0; device backend calls 1 of 1 all-reduces)");
    std::smatch m;
    REQUIRE(std::regex_search(run.output, m, clip));
    const double norm = std::stod(m[1]);
    const double expected = std::stod(m[2]);
    CHECK(std::abs(norm - expected) <= 1e-9 * expected);
    CHECK(expected > 0.5);  // clipping was active
    CHECK_THAT(run.output, Contains(r + "zero2 found_inf 1.0 on testdev:0; device backend calls 1"));
    CHECK_THAT(run.output, Contains(r + "device backend refused 0 CPU tensors"));
  }
}

TEST_CASE("World size 1: DDP leaves gradients alone", "[dist][ddp]") {
  auto pg = trainkit::dist::ProcessGroup::init(trainkit::dist::InitOptions());
  auto net = td::make_chain_net(3);
  trainkit::dist::DistributedDataParallel ddp(net, pg);
  CHECK(ddp.bucket_indices().empty());
  const auto data = td::make_data(12);
  torch::nn::functional::cross_entropy(net->forward(data.first), data.second).backward();
  auto twin = td::make_chain_net(3);
  torch::nn::functional::cross_entropy(twin->forward(data.first), data.second).backward();
  for (size_t i = 0; i < net->parameters().size(); ++i) {
    CHECK(torch::equal(net->parameters()[i].grad(), twin->parameters()[i].grad()));
  }
}

TEST_CASE("Bucket assignment: reverse order, first cap, then bucket_cap", "[dist][ddp]") {
  // float32 tensors of 1 MiB (262144), 0.5 MiB and 2 MiB.
  std::vector<at::Tensor> params = {torch::zeros({262144}), torch::zeros({131072}), torch::zeros({131072}),
                                    torch::zeros({524288}), torch::zeros({131072}, torch::kFloat64)};
  const auto buckets = trainkit::dist::compute_bucket_assignment(params, 1.0, 2.0);
  // Reverse: 4 (f64, alone: dtype changes), 3 (2 MiB >= 1 MiB closes the first), then 2+1+0 (2 MiB).
  REQUIRE(buckets.size() == 3);
  CHECK(buckets[0] == std::vector<int64_t>{4});
  CHECK(buckets[1] == std::vector<int64_t>{3});
  CHECK(buckets[2] == std::vector<int64_t>{2, 1, 0});
  CHECK_THROWS_WITH(trainkit::dist::compute_bucket_assignment(params, 1.0, 0.0), Contains("bucket_cap_mb"));
}

TEST_CASE("TensorLoader shards like DistributedSampler", "[dist][data]") {
  const auto& golden = trainkit::test::golden("dist.toml");
  const auto x = torch::arange(10).to(torch::kFloat32).unsqueeze(1);
  const auto y = torch::arange(10);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    for (int64_t rank = 0; rank < 3; ++rank) {
      DYNAMIC_SECTION("epoch " << epoch << " rank " << rank) {
        trainkit::data::TensorLoader loader(
            x, y, trainkit::data::TensorLoaderOptions().batch_size(100).seed(5).num_replicas(3).rank(rank));
        loader.set_epoch(epoch);
        CHECK(loader.shard_size() == 4);
        const auto batch = loader.batch(0);
        const auto* expected = golden["sampler"]["epoch" + std::to_string(epoch) + "_rank" + std::to_string(rank)].as_array();
        REQUIRE(expected != nullptr);
        REQUIRE(static_cast<size_t>(batch.target().numel()) == expected->size());
        for (size_t i = 0; i < expected->size(); ++i) {
          CHECK(batch.target()[static_cast<int64_t>(i)].item<int64_t>() == (*expected)[i].value<int64_t>().value());
        }
      }
    }
  }
  CHECK_THROWS_WITH(trainkit::data::TensorLoader(x, y, trainkit::data::TensorLoaderOptions().num_replicas(2).rank(2)),
                    Contains("rank 2 not in [0, num_replicas=2)"));
}

namespace {

/// The data and model of the small `trainkit train` runs under the launcher (the other sections follow).
constexpr const char* kSmallRun =
    "[data]\nval_size = 100\nlimit_train = 600\nlimit_test = 200\n[model]\nchannels = [4, 8]\nhidden = 16\n";
/// 40 epochs (far more than a test waits for), a checkpoint and a log line every 5 steps.
constexpr const char* kLongRun =
    "[train]\nepochs = 40\nbatch_size = 25\nseed = 3\nthreads = 1\n"
    "[checkpoint]\nevery_steps = 5\n[log]\nevery_steps = 5\nprogress = \"lines\"\n";

/// Shell lines that start `trainkit train --config <config> --out <run_dir>` on 2 ranks under the launcher
/// (`$launcher` its pid; `timeout -s KILL 120` only guards against a hang), wait for the first checkpoint file
/// matching `file_glob`, send SIG`signal` to rank 1 only (the process of this run whose environment has
/// RANK=1) and echo `said`.
std::string signal_rank1_script(const std::string& config, const std::string& run_dir, const std::string& file_glob,
                                const std::string& signal, const std::string& said) {
  const std::string cli = TRAINKIT_CLI_PATH;
  return "timeout -s KILL 120 " + cli + " launch --nproc 2 --master-port 0 -- " + cli + " train --config " + config +
         " --out " + run_dir + " &\nlauncher=$!\nfor i in $(seq 1200); do ls " + run_dir + "/checkpoints/" + file_glob +
         " >/dev/null 2>&1 && break; sleep 0.05; done\nfor p in $(pgrep -f -- '--out " + run_dir +
         "'); do\n  if tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx RANK=1; then kill -" + signal +
         " $p; echo " + said + "; fi\ndone\n";
}

double summary_value(const std::string& json, const std::string& key) {
  const auto at = json.find("\"" + key + "\": ");
  REQUIRE(at != std::string::npos);
  return std::stod(json.substr(at + key.size() + 4));
}

}  // namespace

TEST_CASE("trainkit train under the launcher: [distributed], rank 0 writes, same model as one process", "[dist][cli]") {
  TempDir tmp("dist-train");
  // No dropout or batch norm, so that 2 ranks x 25 and 1 process x 50 compute the same gradients: the
  // sharded loader gives the two ranks exactly the samples of the single process's batch. SGD, not Adam:
  // Adam's update barely changes when the gradients are summed instead of averaged over the ranks, SGD's
  // doubles, so a missing average fails the comparison below.
  const std::string config = tmp.str("tiny.toml");
  std::ofstream(config) << "[data]\nval_size = 100\nlimit_train = 600\nlimit_test = 200\n"
                           "[model]\nchannels = [4, 8]\nhidden = 16\ndropout = 0.0\nbatch_norm = false\n"
                           "[optimizer]\nname = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n"
                           "[train]\nepochs = 2\nbatch_size = 25\nseed = 3\nthreads = 1\n"
                           "[log]\nevery_steps = 5\nprogress = \"lines\"\n"
                           "[distributed]\nbackend = \"gloo\"\ntimeout = 20\nbucket_cap_mb = 0.01\n";
  const std::string cli = TRAINKIT_CLI_PATH;
  const Run two = shell(cli + " launch --nproc 2 --master-port 0 -- " + cli + " train --config " + config + " --out " +
                            tmp.str("two"),
                        tmp, "two.txt");
  INFO(two.output);
  REQUIRE(two.code == 0);
  CHECK_THAT(two.output, Contains("[rank 0]"));
  CHECK_THAT(two.output, Contains("distributed: 2 ranks, backend gloo"));
  CHECK(two.output.find("[rank 1] [") == std::string::npos);  // rank 1 logs warnings only
  const Run one = shell(cli + " train --config " + config + " --set train.batch_size=50 --out " + tmp.str("one"), tmp,
                        "one.txt");
  INFO(one.output);
  REQUIRE(one.code == 0);
  const std::string two_summary = read_text(tmp.str("two/summary.json"));
  const std::string one_summary = read_text(tmp.str("one/summary.json"));
  CHECK(summary_value(two_summary, "steps") == 20);  // 500 samples / (2 x 25) x 2 epochs
  CHECK(summary_value(one_summary, "steps") == 20);
  // float32 sums in another order: equal to rounding, far below what one step changes.
  CHECK(std::abs(summary_value(two_summary, "test_loss") - summary_value(one_summary, "test_loss")) < 1e-4);
  CHECK(std::filesystem::exists(tmp.str("two/metrics.csv")));
  CHECK(std::filesystem::exists(tmp.str("two/checkpoints")));

  // The same micro-batches accumulated in pairs: 10 optimizer steps instead of 20, and the gradients are
  // all-reduced once per step (no_sync over the first micro-batch of each pair); the ranks also agree on a
  // stop signal once per step (8 bytes), so the run sends 10 x (buckets + 1) fewer all-reduces. Evaluation
  // sums all-reduce the same in both runs. Without no_sync the difference would be 10.
  const Run acc = shell(cli + " launch --nproc 2 --master-port 0 -- " + cli + " train --config " + config +
                            " --set grad.accumulation_steps=2 --out " + tmp.str("acc"),
                        tmp, "acc.txt");
  INFO(acc.output);
  REQUIRE(acc.code == 0);
  const std::string acc_summary = read_text(tmp.str("acc/summary.json"));
  CHECK(summary_value(acc_summary, "steps") == 10);
  const auto at = two.output.find(" gradient buckets");
  REQUIRE(at != std::string::npos);
  const int64_t buckets = std::stoll(two.output.substr(two.output.rfind(' ', at - 1) + 1));
  CHECK(buckets >= 1);
  CHECK(summary_value(two_summary, "all_reduces") - summary_value(acc_summary, "all_reduces") == 10.0 * (buckets + 1));
}

TEST_CASE("trainkit train under the launcher: a TorchScript model trains as one process in Python", "[dist][cli][torchscript]") {
  // The Python-scripted MLP of tests/golden/torchscript.toml, trained by 2 ranks x 25 samples per step, must
  // end where Python's single process ends with batches of 50 (its golden parameters and test loss): the
  // gradient all-reduce reaches the script module's parameters, and rank 0 writes the trained model.
  const auto& golden = trainkit::test::golden("torchscript.toml");
  const auto golden_path = [](const toml::node_view<const toml::node> v) {
    return trainkit::test::source_path("tests/golden/" + *v.value<std::string>());
  };
  TempDir tmp("dist-torchscript");
  const std::string config = tmp.str("ts.toml");
  std::ofstream(config) << *golden["train"]["config"].value<std::string>()
                        << "[distributed]\nbackend = \"gloo\"\ntimeout = 20\nbucket_cap_mb = 0.01\n";
  const std::string cli = TRAINKIT_CLI_PATH;
  const Run two = shell(cli + " launch --nproc 2 --master-port 0 -- " + cli + " train --config " + config +
                            " --set train.batch_size=25 --set model.torchscript=" + golden_path(golden["model"]["file"]) +
                            " --out " + tmp.str("two"),
                        tmp, "two.txt");
  INFO(two.output);
  REQUIRE(two.code == 0);
  CHECK_THAT(two.output, Contains("distributed: 2 ranks, backend gloo"));
  const std::string summary = read_text(tmp.str("two/summary.json"));
  CHECK(summary_value(summary, "steps") == 20);
  CHECK(std::abs(summary_value(summary, "test_loss") - *golden["train"]["test_loss"].value<double>()) < 1e-5);
  torch::jit::Module trained = torch::jit::load(tmp.str("two/model.torchscript.pt"));
  torch::jit::Module python = torch::jit::load(golden_path(golden["train"]["trained"]));
  size_t compared = 0;
  for (const auto& p : python.named_parameters()) {
    INFO(p.name);
    for (const auto& q : trained.named_parameters()) {
      if (q.name == p.name) {
        CHECK((q.value - p.value).abs().max().item<double>() <= 1e-6);
        ++compared;
      }
    }
  }
  CHECK(compared == 4);
}

TEST_CASE("trainkit train under the launcher: a stopped rank ends the job, which then resumes", "[dist][cli][fault]") {
  TempDir tmp("dist-stall");
  const std::string config = tmp.str("stall.toml");
  std::ofstream(config) << kSmallRun << kLongRun << "[distributed]\nbackend = \"gloo\"\ntimeout = 3\n";
  const std::string cli = TRAINKIT_CLI_PATH;
  const std::string run_dir = tmp.str("run");
  // Once the first checkpoint exists, rank 1 (the process of this run whose environment has RANK=1) gets
  // SIGSTOP. `timeout -s KILL 120` only guards against a hang (exit 137 then).
  const std::string script = tmp.str("stall.sh");
  std::ofstream(script)
      << signal_rank1_script(config, run_dir, "ckpt-*.tkpt", "STOP", "stopped rank 1")
      << "t0=$(date +%s%N)\n"
      << "wait $launcher; echo \"launcher exit $?\"\n"
      << "echo \"the job ended $(( ($(date +%s%N) - t0) / 1000000 )) ms after the stop\"\n"
      << "echo \"left: $(pgrep -f -- '--out " << run_dir << "' | wc -l)\"\n";
  const Run stalled = shell("bash " + script, tmp, "stall.txt");
  INFO(stalled.output);
  CHECK_THAT(stalled.output, Contains("stopped rank 1"));
  // Rank 0's next collective fails at the 3 s timeout, naming it; the launcher then ends rank 1
  // (SIGTERM, then SIGKILL since a stopped process cannot act on TERM) and exits 1 naming rank 0.
  // The collective named is the buffers' broadcast before a forward or the gradients' all-reduce, as the
  // stop finds rank 0.
  CHECK_THAT(stalled.output, Contains("failed (a peer exited, lost its connection, or did not join within the 3 s timeout)"));
  CHECK_THAT(stalled.output, Contains("launch: failed: rank 0"));
  CHECK_THAT(stalled.output, Contains("launcher exit 1"));
  CHECK_THAT(stalled.output, Contains("left: 0"));  // no rank survives the job
  // The job resumes from the newest checkpoint under the launcher and trains 10 more steps.
  int64_t newest = 0;
  for (const auto& path : trainkit::train::CheckpointManager(run_dir + "/checkpoints", 3).list()) {
    const std::string name = std::filesystem::path(path).filename().string();  // ckpt-<step>.tkpt
    newest = std::max<int64_t>(newest, std::stoll(name.substr(5, 9)));
  }
  REQUIRE(newest >= 5);
  const Run resumed = shell("timeout -s KILL 120 " + cli + " launch --nproc 2 --master-port 0 -- " + cli +
                                " train --config " + config + " --out " + run_dir + " --resume auto --set train.max_steps=" +
                                std::to_string(newest + 10),
                            tmp, "resumed.txt");
  INFO(resumed.output);
  CHECK(resumed.code == 0);
  CHECK_THAT(resumed.output, Contains("resumed from"));
  CHECK(std::filesystem::exists(run_dir + "/checkpoints/" + fmt::format("ckpt-{:09d}.tkpt", newest + 10)));
}

TEST_CASE("trainkit train under the launcher: SIGTERM that reaches one rank only stops every rank at the same step, "
          "with a committed checkpoint", "[dist][cli][signal]") {
  TempDir tmp("dist-sigterm-one");
  const std::string config = tmp.str("sigterm.toml");
  // ZeRO-2: each checkpoint is a shard per rank and a commit record, which needs both ranks at the same step.
  std::ofstream(config) << kSmallRun << kLongRun << "[distributed]\nbackend = \"gloo\"\ntimeout = 20\n[zero]\nstage = 2\n";
  const std::string cli = TRAINKIT_CLI_PATH;
  const std::string run_dir = tmp.str("run");
  // Once the first commit exists, only rank 1 (the process whose environment has RANK=1) gets SIGTERM, as
  // from a scheduler that signals processes one by one. `timeout -s KILL 120` only guards against a hang.
  const std::string script = tmp.str("sigterm.sh");
  std::ofstream(script) << signal_rank1_script(config, run_dir, "ckpt-*.commit", "TERM", "signalled rank 1")
                        << "wait $launcher; echo \"launcher exit $?\"\n";
  const Run stopped = shell("bash " + script, tmp, "sigterm.txt");
  INFO(stopped.output);
  CHECK_THAT(stopped.output, Contains("signalled rank 1"));
  // Both ranks stop at the step where they agreed (the next boundary after rank 1 saw the signal) and the
  // checkpoint of that step is committed; rank 1's exit (143) then ends the job as a failed rank.
  const std::regex line(R"(\[rank ([01])\] .*stopped by signal 15 \(Terminated\) at epoch \d+, step (\d+); checkpoint (\S+);)");
  std::map<std::string, std::string> step_of;
  std::string commit;
  for (auto it = std::sregex_iterator(stopped.output.begin(), stopped.output.end(), line); it != std::sregex_iterator();
       ++it) {
    step_of[(*it)[1]] = (*it)[2];
    commit = (*it)[3];
  }
  REQUIRE(step_of.size() == 2);
  CHECK(step_of["0"] == step_of["1"]);
  CHECK(commit == run_dir + "/checkpoints/" + fmt::format("ckpt-{:09d}.commit", std::stoll(step_of["0"])));
  CHECK_NOTHROW(trainkit::train::verify_commit(commit));
  CHECK_THAT(stopped.output, !Contains("timeout") && !Contains("failed (a peer exited"));
  // The job resumes from that commit on 2 ranks.
  const int64_t step = std::stoll(step_of["0"]);
  const Run resumed = shell("timeout -s KILL 120 " + cli + " launch --nproc 2 --master-port 0 -- " + cli +
                                " train --config " + config + " --out " + run_dir + " --resume auto --set train.max_steps=" +
                                std::to_string(step + 5),
                            tmp, "resumed.txt");
  INFO(resumed.output);
  CHECK(resumed.code == 0);
  CHECK_THAT(resumed.output, Contains("resumed from " + commit));
}

TEST_CASE("trainkit launch --max-restarts: a rank killed twice mid-run, restarted with --resume auto, ends bitwise "
          "equal to an uninterrupted run", "[dist][cli][fault]") {
  TempDir tmp("dist-elastic");
  const std::string config = tmp.str("elastic.toml");
  std::ofstream(config) << kSmallRun
                        << "[train]\nepochs = 16\nbatch_size = 25\nseed = 3\nthreads = 1\n"
                           "[checkpoint]\nevery_steps = 5\nkeep_last = 2\n[log]\nevery_steps = 5\nprogress = \"lines\"\n"
                           "[distributed]\nbackend = \"gloo\"\ntimeout = 10\n";
  const std::string cli = TRAINKIT_CLI_PATH;
  const std::string run_dir = tmp.str("run");
  // 160 steps (10 per epoch). Rank 1 of the first start is SIGKILLed once a checkpoint of step >= 20 exists,
  // rank 1 of the second start once one of step >= 80 exists; each start is told apart by the
  // TORCHELASTIC_RESTART_COUNT in its environment. `timeout -s KILL 300` guards against a hang only.
  const std::string script = tmp.str("elastic.sh");
  std::ofstream(script)
      << "timeout -s KILL 300 " << cli << " launch --nproc 2 --master-port 0 --max-restarts 3 -- " << cli
      << " train --config " << config << " --out " << run_dir << " --resume auto &\n"
      << "launcher=$!\n"
      << "newest() { ls " << run_dir << "/checkpoints/ 2>/dev/null | sed -n 's/^ckpt-0*\\([0-9][0-9]*\\)\\.tkpt$/\\1/p' | sort -n | tail -1; }\n"
      // Waits (up to 60 s) until both a checkpoint of the step and that start's rank 1 exist: a start that
      // is still being launched when the checkpoint is already there (written by the start before) is waited for.
      << "kill_rank1() {  # $1: the start's restart count, $2: the checkpoint step to wait for\n"
      << "  for i in $(seq 6000); do\n"
      << "    s=$(newest)\n"
      << "    if [ -n \"$s\" ] && [ \"$s\" -ge $2 ]; then\n"
      << "      for p in $(pgrep -f -- '--out " << run_dir << " --resume'); do\n"
      << "        env=$(tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null)\n"
      << "        if echo \"$env\" | grep -qx RANK=1 && echo \"$env\" | grep -qx TORCHELASTIC_RESTART_COUNT=$1; then\n"
      << "          kill -KILL $p && echo \"killed rank 1 of start $1 at checkpoint $(newest)\" && return\n"
      << "        fi\n"
      << "      done\n"
      << "    fi\n"
      << "    sleep 0.01\n"
      << "  done\n"
      << "}\n"
      << "kill_rank1 0 20\n"
      << "kill_rank1 1 80\n"
      << "wait $launcher; echo \"launcher exit $?\"\n";
  const Run elastic = shell("bash " + script, tmp, "elastic.txt");
  INFO(elastic.output);
  CHECK_THAT(elastic.output, Contains("killed rank 1 of start 0"));
  CHECK_THAT(elastic.output, Contains("killed rank 1 of start 1"));
  CHECK_THAT(elastic.output, Contains("launch: restarting all 2 ranks (restart 1 of 3) after rank "));
  CHECK_THAT(elastic.output, Contains("launch: restarting all 2 ranks (restart 2 of 3)"));
  CHECK(elastic.output.find("restart 3 of 3") == std::string::npos);
  CHECK_THAT(elastic.output, Contains("resumed from"));
  REQUIRE_THAT(elastic.output, Contains("launcher exit 0"));

  const Run whole = shell("timeout -s KILL 300 " + cli + " launch --nproc 2 --master-port 0 -- " + cli +
                              " train --config " + config + " --out " + tmp.str("whole"),
                          tmp, "whole.txt");
  INFO(whole.output);
  REQUIRE(whole.code == 0);
  // The final weights (the safetensors export) and the test loss, bit for bit.
  CHECK(read_text(run_dir + "/model.safetensors") == read_text(tmp.str("whole/model.safetensors")));
  CHECK(summary_value(read_text(run_dir + "/summary.json"), "test_loss") ==
        summary_value(read_text(tmp.str("whole/summary.json")), "test_loss"));
  CHECK(summary_value(read_text(run_dir + "/summary.json"), "steps") == 160);
}

TEST_CASE("trainkit launch --max-restarts: restarts used up, the launcher fails naming the rank", "[dist][launch]") {
  TempDir tmp("launch-restarts");
  // Every start fails (rank 1 exits 3 once rank 0 has said it started): 1 + 2 starts, then the failure
  // with the restarts counted.
  const Run run = shell("timeout -s KILL 120 " + std::string(TRAINKIT_CLI_PATH) +
                            " launch --nproc 2 --master-port 0 --max-restarts 2 -- bash -c "
                            "'echo start $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS; f=" +
                            tmp.str("started") +
                            ".$TORCHELASTIC_RESTART_COUNT; if [ $RANK = 1 ]; then while [ ! -e $f ]; do sleep 0.05; "
                            "done; exit 3; fi; touch $f; sleep 30'",
                        tmp);
  INFO(run.output);
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Contains("[rank 0] start 0 of 2"));
  CHECK_THAT(run.output, Contains("[rank 1] start 2 of 2"));
  CHECK_THAT(run.output, Contains("launch: restarting all 2 ranks (restart 2 of 2) after rank 1 exited with code 3"));
  CHECK_THAT(run.output, Contains("launch: failed: rank 1 exited with code 3 (of 2 ranks"));
  CHECK_THAT(run.output, Contains("2 of 2 restarts used)"));
  const Run bad = shell(std::string(TRAINKIT_CLI_PATH) + " launch --nproc 2 --max-restarts=-1 -- true", tmp, "bad.txt");
  CHECK(bad.code != 0);  // the parser's validation error
  CHECK_THAT(bad.output, Contains("--max-restarts"));
}

TEST_CASE("trainkit train: bad distributed environment is a usage error", "[dist][cli]") {
  TempDir tmp("dist-train-bad");
  const std::string config = tmp.str("tiny.toml");
  std::ofstream(config) << "[data]\nlimit_train = 600\nlimit_test = 200\n[train]\nepochs = 1\n";
  const Run run = shell("WORLD_SIZE=2 " + std::string(TRAINKIT_CLI_PATH) + " train --config " + config + " --out " +
                            tmp.str("run"),
                        tmp);
  CHECK(run.code == 2);
  CHECK_THAT(run.output, Contains("WORLD_SIZE=2 is set but RANK is not"));
  CHECK_FALSE(std::filesystem::exists(tmp.str("run")));
}

TEST_CASE("Trainer::evaluate reduces loss and metrics over 2 ranks", "[dist][metrics]") {
  TempDir tmp("metrics");
  const Run run = launch_worker("--mode metrics", tmp);
  INFO(run.output);
  REQUIRE(run.code == 0);
  // The same model on the whole data set, in one process.
  const td::MetricsProblem problem;
  auto model = problem.model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  trainkit::train::Trainer trainer(model, opt);
  trainer.set_metrics({trainkit::train::accuracy(), trainkit::train::top_k_accuracy(2)});
  trainkit::data::TensorLoader all(problem.x, problem.y, trainkit::data::TensorLoaderOptions().batch_size(46).shuffle(false));
  const auto r = trainer.evaluate(all);
  // Hand-computed accuracy of the whole set.
  torch::NoGradGuard no_grad;
  const double correct = model->forward(problem.x).argmax(1).eq(problem.y).sum().item<double>();
  CHECK(r.metric("accuracy") == correct / 46.0);
  for (const int rank : {0, 1}) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) + ": samples 46 loss ";
    const auto at = run.output.find(prefix);
    REQUIRE(at != std::string::npos);
    double loss = 0, accuracy = 0, top2 = 0;
    REQUIRE(std::sscanf(run.output.c_str() + at + prefix.size(), "%lf accuracy %lf top2 %lf", &loss, &accuracy, &top2) == 3);
    CHECK(loss == Approx(r.loss).epsilon(1e-6));  // float32 means of other batches
    CHECK(accuracy == Approx(r.metric("accuracy")).margin(1e-11));  // printed with 12 decimals
    CHECK(top2 == Approx(r.metric("top2_accuracy")).margin(1e-11));
  }
}

TEST_CASE("trainkit train: SIGTERM stops at a step boundary with its checkpoint written, exit 143, and the run "
          "resumes from it", "[dist][cli][signal]") {
  TempDir tmp("train-sigterm");
  const std::string config = tmp.str("sigterm.toml");
  std::ofstream(config) << kSmallRun << kLongRun;
  const std::string cli = TRAINKIT_CLI_PATH;
  const std::string run_dir = tmp.str("run");
  // SIGTERM once the first checkpoint (step 5) exists; 960 steps are far from done then. No `timeout` wraps
  // the run (it would take the signal); ctest's per-test TIMEOUT is the hang guard.
  const Run stopped = shell("{ " + cli + " train --config " + config + " --out " + run_dir + " > " + tmp.str("train.txt") +
                                " 2>&1 & p=$!; for i in $(seq 1200); do ls " + run_dir +
                                "/checkpoints/ckpt-*.tkpt >/dev/null 2>&1 && break; sleep 0.05; done; kill -TERM $p; "
                                "wait $p; echo \"train exit $?\"; cat " + tmp.str("train.txt") + "; }",
                            tmp);
  INFO(stopped.output);
  CHECK_THAT(stopped.output, Contains("train exit 143"));
  std::smatch match;
  REQUIRE(std::regex_search(stopped.output, match,
                            std::regex(R"(stopped by signal 15 \(Terminated\) at epoch \d+, step (\d+); checkpoint (\S+);)")));
  const int64_t step = std::stoll(match[1]);
  const std::string checkpoint = match[2];
  CHECK(checkpoint == run_dir + "/checkpoints/" + fmt::format("ckpt-{:09d}.tkpt", step));
  // The checkpoint of the step it stopped at verifies, and the run continues from it.
  const Run digest = shell(cli + " checkpoint " + checkpoint, tmp, "digest.txt");
  INFO(digest.output);
  CHECK(digest.code == 0);
  CHECK_THAT(digest.output, Contains(": ok, epoch") && Contains(fmt::format(" step {},", step)));
  const Run resumed = shell(cli + " train --config " + config + " --out " + run_dir +
                                " --resume auto --set train.max_steps=" + std::to_string(step + 5),
                            tmp, "resumed.txt");
  INFO(resumed.output);
  CHECK(resumed.code == 0);
  CHECK_THAT(resumed.output, Contains("resumed from " + checkpoint));
  CHECK(std::filesystem::exists(run_dir + "/checkpoints/" + fmt::format("ckpt-{:09d}.tkpt", step + 5)));
}
