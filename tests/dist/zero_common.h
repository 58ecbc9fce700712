#pragma once
// What the multi-process ZeRO tests share (tests/dist/test_zero.cpp, tests/dist/test_fully_shard.cpp): running
// tests/dist/dist_worker.cpp on 2 ranks under `trainkit launch` or as one rank, reading what it wrote and
// printed, and the unsharded single-process reference run.
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "dist/dist_common.h"
#include "support.h"
#include "trainkit/dist/zero.h"
#include "trainkit/grad/clip.h"

namespace td = trainkit::test::dist;

namespace zero_test {

using trainkit::test::TempDir;

struct Outcome {
  int code;
  std::string output;
};

/// Runs `command` through the shell with stdout and stderr in `tmp/name`; `timeout -s KILL` only guards
/// against a hang.
inline Outcome run(const std::string& command, const TempDir& tmp, const std::string& name) {
  const std::string log = tmp.str(name);
  const int status = std::system(("timeout -s KILL 300 " + command + " > " + log + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, trainkit::test::read_text(log)};
}

/// dist_worker --mode `mode` (zero2 or fsdp) on 2 ranks under the launcher.
inline Outcome two_ranks(const std::string& args, const TempDir& tmp, const std::string& name,
                         const std::string& mode = "zero2") {
  return run(std::string("env TRAINKIT_DIST_TIMEOUT=20 ") + TRAINKIT_CLI_PATH + " launch --nproc 2 --master-port 0 -- " +
                 TRAINKIT_DIST_WORKER_PATH + " --mode " + mode + " --bucket-kb 1 " + args,
             tmp, name);
}

/// dist_worker --mode `mode` as a single process (world size 1), 12 rows per step as 2 ranks x 6.
inline Outcome one_rank(const std::string& args, const TempDir& tmp, const std::string& name,
                        const std::string& mode = "zero2") {
  return run(std::string("env -u RANK -u WORLD_SIZE ") + TRAINKIT_DIST_WORKER_PATH + " --mode " + mode + " --micro 12 " + args,
             tmp, name);
}

/// `trainkit train --config <config> --out <tmp>/<name> <extra>` under the launcher on 2 ranks (or as one
/// process); requires exit 0 and returns the output.
inline std::string train_job(const std::string& config, const TempDir& tmp, const std::string& name,
                             const std::string& extra, bool launch = true) {
  const std::string cli = TRAINKIT_CLI_PATH;
  const std::string command = cli + " train --config " + config + " --out " + tmp.str(name) + " " + extra;
  const Outcome out = run(launch ? cli + " launch --nproc 2 --master-port 0 -- " + command : command, tmp,
                          name + ".txt");
  INFO(out.output);
  REQUIRE(out.code == 0);
  return out.output;
}

/// The number after `"key": ` in a summary.json.
inline double summary_number(const std::string& json, const std::string& key) {
  const auto at = json.find("\"" + key + "\": ");
  REQUIRE(at != std::string::npos);
  return std::stod(json.substr(at + key.size() + 4));
}

inline std::vector<at::Tensor> params_of(const std::string& path) {
  std::vector<at::Tensor> params;
  torch::load(params, path);
  return params;
}

inline double largest_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

inline bool bitwise_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

/// What one unsharded process does with the full batch of every step (2 ranks x accum x 6 rows):
/// optimizer `name`, the norm clipped to `clip` (0 = off), step `skip` not taken (-1 = none).
struct Reference {
  std::vector<at::Tensor> params;
  int64_t state_bytes = 0;
  int64_t gradient_bytes = 0;
  std::vector<double> norms;
};

inline Reference reference(const std::string& name, int64_t steps, int64_t accum, double clip, int64_t skip = -1) {
  auto net = td::make_chain_net(7);
  const int64_t global = 2 * accum * td::kMicro;
  const auto data = td::make_data(steps * global);
  auto opt = name == "layer_decay" ? td::make_layer_decay_optimizer(td::make_layer_decay_groups(*net))
                                   : td::make_zero_test_optimizer(name, net->parameters());
  Reference r;
  for (int64_t s = 0; s < steps; ++s) {
    opt->zero_grad();
    torch::nn::functional::cross_entropy(net->forward(data.first.narrow(0, s * global, global)),
                                         data.second.narrow(0, s * global, global))
        .backward();
    if (clip > 0) r.norms.push_back(trainkit::grad::clip_grad_norm_(net->parameters(), clip).item<double>());
    if (s != skip) opt->step();
  }
  for (const auto& p : net->parameters()) r.gradient_bytes += static_cast<int64_t>(p.grad().nbytes());
  r.state_bytes = trainkit::dist::optimizer_state_bytes(*opt);
  r.params = td::snapshot(*net);
  return r;
}

/// The integer after `key` in rank `rank`'s line of the launcher's output.
inline int64_t reported(const std::string& output, int64_t rank, const std::string& key) {
  const std::string prefix = "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) + ": ";
  for (size_t at = output.find(prefix); at != std::string::npos; at = output.find(prefix, at + 1)) {
    const size_t end = output.find('\n', at);
    const std::string line = output.substr(at, end - at);
    const auto k = line.find(key);
    if (k != std::string::npos) return std::stoll(line.substr(k + key.size()));
  }
  FAIL("no '" << key << "' reported by rank " << rank);
  return -1;
}

}  // namespace zero_test
