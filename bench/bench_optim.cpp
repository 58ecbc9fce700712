// bench_optim: step time of trainkit's optimizers (fused kernel and ATen reference path) against LibTorch's
// torch::optim, PyTorch's own fused CPU kernels (at::_fused_adam_ / at::_fused_adamw_) and an in-process
// floor kernel that moves the same bytes as fused Adam (read p, g, m, v; write p, m, v) with trivial math.
// Variants are interleaved round by round after a warm-up and medians reported, so the ratios come from
// one run on the same, possibly noisy, machine.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/optim.h"

namespace {

using Clock = std::chrono::steady_clock;

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define BENCH_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define BENCH_MULTIVERSION
#endif

/// The floor: Adam's memory traffic (28 bytes per float32 parameter) with one add per stream.
BENCH_MULTIVERSION void floor_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                     float* __restrict__ v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    m[i] += gi;
    v[i] += gi;
    p[i] -= 1e-9f * gi;
  }
}

struct FloorState {
  std::vector<at::Tensor> m, v;
};

void floor_step(const std::vector<at::Tensor>& params, FloorState& s) {
  constexpr int64_t grain = 1 << 15;
  struct Chunk {
    size_t t;
    int64_t begin, n;
  };
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < params.size(); ++t) {
    for (int64_t b = 0; b < params[t].numel(); b += grain) {
      chunks.push_back({t, b, std::min(grain, params[t].numel() - b)});
    }
  }
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const Chunk& ch = chunks[static_cast<size_t>(c)];
      floor_kernel(params[ch.t].data_ptr<float>() + ch.begin, params[ch.t].grad().data_ptr<float>() + ch.begin,
                   s.m[ch.t].data_ptr<float>() + ch.begin, s.v[ch.t].data_ptr<float>() + ch.begin, ch.n);
    }
  });
}

/// PyTorch's fused CPU Adam/AdamW, called as torch.optim.Adam(fused=True) calls it.
struct AtenFused {
  std::vector<at::Tensor> m, v, steps;
  bool adamw;
  void step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
    for (auto& s : steps) {
      s.add_(1);
    }
    if (adamw) {
      at::_fused_adamw_(params, grads, m, v, {}, steps, 1e-3, 0.9, 0.999, 1e-2, 1e-8, false, false);
    } else {
      at::_fused_adam_(params, grads, m, v, {}, steps, 1e-3, 0.9, 0.999, 0.0, 1e-8, false, false);
    }
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Case {
  std::string name;
  int64_t total;
  int64_t count;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Optimizer step time: trainkit (fused / reference) vs torch::optim vs at::_fused_adam_ vs a floor"};
  int rounds = 15;
  int threads = 0;
  std::string json_path;
  std::vector<std::string> only;
  std::vector<std::string> variants_only;
  app.add_option("--rounds", rounds, "Interleaved rounds per case (median reported)")->capture_default_str();
  app.add_option("--threads", threads, "Intra-op threads (0 = LibTorch's default)")->capture_default_str();
  app.add_option("--cases", only, "Run only these cases (10M/16, 1M/256, 64M/16)");
  app.add_option("--variants", variants_only, "Run only variants whose name contains one of these strings");
  app.add_option("--json", json_path, "Also write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) {
    torch::set_num_threads(threads);
  }
  torch::NoGradGuard no_grad;
  fmt::print("Optimizer step, float32 CPU, {} threads, median of {} interleaved rounds (1 warm-up), milliseconds\n",
             torch::get_num_threads(), rounds);

  std::string json = fmt::format("{{\"threads\": {}, \"rounds\": {}, \"cases\": [", torch::get_num_threads(), rounds);
  std::vector<std::string> goal_lines;
  bool first_case = true;
  for (const Case& c : {Case{"10M/16", 10'000'000, 16}, Case{"1M/256", 1'048'576, 256}, Case{"64M/16", 64'000'000, 16}}) {
    if (!only.empty() && std::find(only.begin(), only.end(), c.name) == only.end()) {
      continue;
    }
    torch::manual_seed(0);
    std::vector<at::Tensor> params;
    std::vector<at::Tensor> grads;
    for (int64_t i = 0; i < c.count; ++i) {
      at::Tensor p = torch::randn({c.total / c.count}).requires_grad_();
      p.mutable_grad() = torch::randn({c.total / c.count}) * 1e-3;
      params.push_back(p);
      grads.push_back(p.grad());
    }
    const auto zeros = [&] {
      std::vector<at::Tensor> out;
      for (const auto& p : params) {
        out.push_back(torch::zeros_like(p));
      }
      return out;
    };

    using namespace trainkit::optim;
    std::vector<std::pair<std::string, std::unique_ptr<torch::optim::Optimizer>>> optimizers;
    optimizers.emplace_back("trainkit Adam fused", std::make_unique<Adam>(params, AdamOptions(1e-3)));
    optimizers.emplace_back("trainkit Adam reference", std::make_unique<Adam>(params, AdamOptions(1e-3).fused(false)));
    optimizers.emplace_back("trainkit AdamW fused", std::make_unique<AdamW>(params, AdamWOptions(1e-3)));
    optimizers.emplace_back("trainkit SGD-momentum fused", std::make_unique<Sgd>(params, SgdOptions(1e-3).momentum(0.9)));
    optimizers.emplace_back("trainkit SGD-momentum reference",
                            std::make_unique<Sgd>(params, SgdOptions(1e-3).momentum(0.9).fused(false)));
    optimizers.emplace_back("trainkit LARS fused",
                            std::make_unique<Lars>(params, LarsOptions(0.1).momentum(0.9).weight_decay(1e-4)));
    optimizers.emplace_back("trainkit LARS reference",
                            std::make_unique<Lars>(params, LarsOptions(0.1).momentum(0.9).weight_decay(1e-4).fused(false)));
    optimizers.emplace_back("trainkit LAMB fused", std::make_unique<Lamb>(params, LambOptions(1e-3)));
    optimizers.emplace_back("trainkit LAMB reference", std::make_unique<Lamb>(params, LambOptions(1e-3).fused(false)));
    optimizers.emplace_back("torch::optim::Adam", std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3)));
    optimizers.emplace_back("torch::optim::AdamW",
                            std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3)));
    optimizers.emplace_back("torch::optim::SGD-momentum",
                            std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(1e-3).momentum(0.9)));
    FloorState floor{zeros(), zeros()};
    std::vector<at::Tensor> steps_a;
    std::vector<at::Tensor> steps_w;
    for (size_t i = 0; i < params.size(); ++i) {
      steps_a.push_back(torch::zeros({}));
      steps_w.push_back(torch::zeros({}));
    }
    AtenFused aten_adam{zeros(), zeros(), steps_a, false};
    AtenFused aten_adamw{zeros(), zeros(), steps_w, true};

    std::vector<std::pair<std::string, std::function<void()>>> variants;
    variants.emplace_back("floor (same bytes as Adam)", [&] { floor_step(params, floor); });
    variants.emplace_back("at::_fused_adam_", [&] { aten_adam.step(params, grads); });
    variants.emplace_back("at::_fused_adamw_", [&] { aten_adamw.step(params, grads); });
    for (auto& [name, opt] : optimizers) {
      torch::optim::Optimizer* o = opt.get();
      variants.emplace_back(name, [o] { o->step(); });
    }
    if (!variants_only.empty()) {
      std::vector<std::pair<std::string, std::function<void()>>> kept;
      for (auto& v : variants) {
        if (std::any_of(variants_only.begin(), variants_only.end(),
                        [&](const std::string& s) { return v.first.find(s) != std::string::npos; })) {
          kept.push_back(std::move(v));
        }
      }
      variants = std::move(kept);
    }
    std::map<std::string, std::vector<double>> times;
    for (int round = 0; round <= rounds; ++round) {
      for (auto& [name, step] : variants) {
        const auto start = Clock::now();
        step();
        const double s = std::chrono::duration<double>(Clock::now() - start).count();
        if (round > 0) {  // round 0 warms up (allocates state, faults pages in)
          times[name].push_back(s);
        }
      }
    }
    std::map<std::string, double> ms;
    for (auto& [name, t] : times) {
      ms[name] = median(t) * 1e3;
    }
    const double adam = ms.count("trainkit Adam fused") ? ms["trainkit Adam fused"] : std::nan("");
    fmt::print("\n{} ({} params in {} tensors)\n", c.name, c.total, c.count);
    fmt::print("{:<34} {:>10} {:>16}\n", "variant", "ms", "× trainkit Adam");
    json += fmt::format("{}{{\"case\": \"{}\", \"ms\": {{", first_case ? "" : ", ", c.name);
    bool first = true;
    for (const auto& [name, step] : variants) {
      fmt::print("{:<34} {:>10.2f} {:>16.2f}\n", name, ms[name], ms[name] / adam);
      json += fmt::format("{}\"{}\": {:.4f}", first ? "" : ", ", name, ms[name]);
      first = false;
    }
    json += "}}";
    first_case = false;

    const auto goal = [&](const std::string& what, double ratio, const std::string& cmp, double target) {
      if (!std::isfinite(ratio) || ratio <= 0) {
        return;  // a variant of the ratio was not run
      }
      const bool met = cmp == ">=" ? ratio >= target : ratio <= target;
      goal_lines.push_back(fmt::format("{:<8} {:<52} {:>6.2f}  goal {} {:<5} {}", c.name, what, ratio, cmp, target,
                                       met ? "met" : "NOT met"));
    };
    if (c.name == "10M/16") {
      goal("torch::optim::Adam / trainkit fused Adam", ms["torch::optim::Adam"] / adam, ">=", 4.0);
    }
    if (c.name == "1M/256") {
      goal("torch::optim::Adam / trainkit fused Adam", ms["torch::optim::Adam"] / adam, ">=", 10.0);
    }
    goal("trainkit fused Adam / at::_fused_adam_", adam / ms["at::_fused_adam_"], "<=", 1.0);
    goal("trainkit fused AdamW / at::_fused_adamw_", ms["trainkit AdamW fused"] / ms["at::_fused_adamw_"], "<=", 1.0);
    if (c.name == "64M/16") {
      goal("trainkit fused Adam / floor", adam / ms["floor (same bytes as Adam)"], "<=", 1.2);
    }
    goal("LARS fused / SGD-momentum fused", ms["trainkit LARS fused"] / ms["trainkit SGD-momentum fused"], "<=", 1.5);
    goal("LAMB fused / Adam fused", ms["trainkit LAMB fused"] / adam, "<=", 2.0);
  }
  json += "]}\n";
  fmt::print("\nGoals (ratios from this run)\n");
  for (const auto& line : goal_lines) {
    fmt::print("{}\n", line);
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << json;
  }
  return 0;
}
