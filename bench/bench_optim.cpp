// bench_optim: step time of trainkit's optimizers (fused kernel and ATen reference path) against LibTorch's
// torch::optim, PyTorch's own fused CPU kernels (at::_fused_adam_ / at::_fused_adamw_, also on bfloat16
// parameters), an in-process floor kernel that moves the same bytes as fused Adam (read p, g, m, v; write
// p, m, v) with trivial math, and a STREAM-style bandwidth probe (copy c = a, triad a = b + s·c) on arrays
// of the case's size with the same threads. Each memory-bound kernel is also reported as a fraction of the
// triad's bandwidth: the bytes it must move (each stream once) / its time / the triad's bytes per second.
// Variants are interleaved round by round after a warm-up and medians reported, so the ratios come from
// one run on the same, possibly noisy, machine. trainkit's optimizers also run through ATen's fused kernels
// (`aten_fused`). `--device cuda` times the paths that run on a GPU (trainkit's foreach and ATen-fused
// paths, torch::optim, at::_fused_adam_), each step followed by a device synchronize. `--deepspeed` adds
// DeepSpeed's DeepSpeedCPUAdam (the CPU Adam of ZeRO-Offload) as a Python peer process
// (scripts/bench_optim_peer.py, the project's virtual environment): one step per round on request, timed
// inside the peer, interleaved with the in-process variants.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <type_traits>

#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <thread>

#include <unistd.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "trainkit/amp/grad_scaler.h"
#include "trainkit/app/cli.h"
#include "trainkit/app/main.h"
#include "trainkit/optim.h"
#include "trainkit/subprocess.h"
// The benchmarking switches of the kernels (set_kernel_choices: baseline x86-64 instead of AVX2, the old
// 32K-element chunk split or a per-tensor one), so that the variants run interleaved in one process.
#include "detail/kernels.h"
// The library's door into ATen's thread pool: at::parallel_for in this file (compiled without OpenMP) would
// run on one thread.
#include "detail/parallel_range.h"


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
  trainkit::detail::parallel_range(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const Chunk& ch = chunks[static_cast<size_t>(c)];
      floor_kernel(params[ch.t].data_ptr<float>() + ch.begin, params[ch.t].grad().data_ptr<float>() + ch.begin,
                   s.m[ch.t].data_ptr<float>() + ch.begin, s.v[ch.t].data_ptr<float>() + ch.begin, ch.n);
    }
  });
}

/// STREAM's copy and triad (McCalpin), float32, each thread on one contiguous share of the arrays.
BENCH_MULTIVERSION void copy_kernel(float* __restrict__ c, const float* __restrict__ a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    c[i] = a[i];
  }
}
BENCH_MULTIVERSION void triad_kernel(float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ c,
                                     int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    a[i] = b[i] + 3.0f * c[i];
  }
}

struct Stream {
  at::Tensor a, b, c;
  template <class Fn>
  static void split(int64_t n, const Fn& fn) {
    const int64_t threads = at::get_num_threads();
    trainkit::detail::parallel_range(0, threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t lo = n * t / threads / 16 * 16;
        const int64_t hi = t + 1 == threads ? n : n * (t + 1) / threads / 16 * 16;
        fn(lo, hi - lo);
      }
    });
  }
  void copy() {
    split(a.numel(), [&](int64_t lo, int64_t n) { copy_kernel(c.data_ptr<float>() + lo, a.data_ptr<float>() + lo, n); });
  }
  void triad() {
    split(a.numel(), [&](int64_t lo, int64_t n) {
      triad_kernel(a.data_ptr<float>() + lo, b.data_ptr<float>() + lo, c.data_ptr<float>() + lo, n);
    });
  }
};

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

/// Gives a trainkit Adam/AdamW the moment tensors m and v as its state before the first step.
void set_adam_state(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params,
                    const std::vector<at::Tensor>& m, const std::vector<at::Tensor>& v) {
  for (size_t i = 0; i < params.size(); ++i) {
    auto s = std::make_unique<trainkit::optim::AdamParamState>();
    s->exp_avg(m[i]);
    s->exp_avg_sq(v[i]);
    opt.state()[params[i].unsafeGetTensorImpl()] = std::move(s);
  }
}

/// Gives a trainkit Adam/AdamW its state in the parameters' dtype before the first step (as torch.optim keeps
/// it for bfloat16 parameters; trainkit's default is float32).
void state_in_param_dtype(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> m;
  std::vector<at::Tensor> v;
  for (const auto& p : params) {
    m.push_back(torch::zeros_like(p));
    v.push_back(torch::zeros_like(p));
  }
  set_adam_state(opt, params, m, v);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Case {
  std::string name;
  int64_t total;
  int64_t count;
};

/// The parameters of case `c` (seeded random values, `count` tensors of `total / count`), with gradients of
/// 1e-3 × randn, which are also appended to `grads`.
std::vector<at::Tensor> case_params(const Case& c, const torch::TensorOptions& on, std::vector<at::Tensor>& grads) {
  torch::manual_seed(0);
  std::vector<at::Tensor> params;
  for (int64_t i = 0; i < c.count; ++i) {
    at::Tensor p = torch::randn({c.total / c.count}, on).requires_grad_();
    p.mutable_grad() = torch::randn({c.total / c.count}, on) * 1e-3;
    params.push_back(p);
    grads.push_back(p.grad());
  }
  return params;
}

/// Times, on `device`, the optimizers' paths that run off the CPU: trainkit's foreach and ATen-fused paths,
/// torch::optim and at::_fused_adam_; each step is followed by a synchronize. Prints one table per case.
void run_on_device(const std::vector<Case>& cases, c10::Device device, int rounds) {
  using namespace trainkit::optim;
  for (const Case& c : cases) {
    const auto on = torch::TensorOptions().device(device);
    std::vector<at::Tensor> grads;
    const std::vector<at::Tensor> params = case_params(c, on, grads);
    std::vector<std::pair<std::string, std::unique_ptr<torch::optim::Optimizer>>> optimizers;
    optimizers.emplace_back("trainkit Adam foreach", std::make_unique<Adam>(params, AdamOptions(1e-3)));
    optimizers.emplace_back("trainkit Adam aten_fused", std::make_unique<Adam>(params, AdamOptions(1e-3).fused(true)));
    optimizers.emplace_back("trainkit AdamW foreach", std::make_unique<AdamW>(params, AdamWOptions(1e-3)));
    optimizers.emplace_back("trainkit AdamW aten_fused",
                            std::make_unique<AdamW>(params, AdamWOptions(1e-3).fused(true)));
    optimizers.emplace_back("trainkit SGD-momentum foreach", std::make_unique<Sgd>(params, SgdOptions(1e-3).momentum(0.9)));
    optimizers.emplace_back("trainkit SGD-momentum aten_fused",
                            std::make_unique<Sgd>(params, SgdOptions(1e-3).momentum(0.9).fused(true)));
    optimizers.emplace_back("trainkit LAMB foreach", std::make_unique<Lamb>(params, LambOptions(1e-3)));
    optimizers.emplace_back("trainkit LARS foreach",
                            std::make_unique<Lars>(params, LarsOptions(0.1).momentum(0.9).weight_decay(1e-4)));
    optimizers.emplace_back("torch::optim::Adam", std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3)));
    optimizers.emplace_back("torch::optim::SGD-momentum",
                            std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(1e-3).momentum(0.9)));
    std::vector<at::Tensor> m;
    std::vector<at::Tensor> v;
    std::vector<at::Tensor> steps;
    for (const auto& p : params) {
      m.push_back(torch::zeros_like(p));
      v.push_back(torch::zeros_like(p));
      steps.push_back(torch::zeros({}, on));
    }
    AtenFused aten_adam{m, v, steps, false};
    std::vector<std::pair<std::string, std::function<void()>>> variants;
    variants.emplace_back("at::_fused_adam_", [&] { aten_adam.step(params, grads); });
    for (auto& [name, opt] : optimizers) {
      torch::optim::Optimizer* o = opt.get();
      variants.emplace_back(name, [o] { o->step(); });
    }
    std::map<std::string, std::vector<double>> times;
    for (int round = 0; round <= rounds; ++round) {
      for (auto& [name, step] : variants) {
        torch::cuda::synchronize();
        const auto start = Clock::now();
        step();
        torch::cuda::synchronize();
        if (round > 0) {
          times[name].push_back(std::chrono::duration<double>(Clock::now() - start).count());
        }
      }
    }
    const double adam = median(times["trainkit Adam foreach"]) * 1e3;
    // Adam and AdamW read p, g, m, v and write p, m, v: 28 bytes per float32 parameter at the least.
    const double adam_gb = 28.0 * static_cast<double>(c.total) / 1e9;
    fmt::print("\n{} on {} ({} params in {} tensors)\n{:<42} {:>10} {:>22} {:>12}\n", c.name, device.str(), c.total,
               c.count, "variant", "ms", "× trainkit Adam foreach", "Adam GB/s");
    for (const auto& [name, step] : variants) {
      const double ms = median(times[name]) * 1e3;
      const bool adam_like = name.find("Adam") != std::string::npos || name.find("_adam") != std::string::npos;
      fmt::print("{:<42} {:>10.3f} {:>22.2f} {:>12}\n", name, ms, ms / adam,
                 adam_like ? fmt::format("{:.0f}", adam_gb / (ms / 1e3)) : "-");
    }
  }
}

/// DeepSpeedCPUAdam in a Python peer process (scripts/bench_optim_peer.py) over parameters of the case's
/// shapes: step() asks it for one step and returns the step's time as the peer measured it, in seconds.
class DeepSpeedPeer {
 public:
  DeepSpeedPeer(const std::string& python, const Case& c, int threads) {
    const std::string script = std::string(TRAINKIT_SOURCE_DIR) + "/scripts/bench_optim_peer.py";
    child_ = trainkit::Subprocess(trainkit::SubprocessOptions()
                                      .argv({python, script, std::to_string(c.total), std::to_string(c.count),
                                             std::to_string(threads)})
                                      .env({{"OMP_NUM_THREADS", std::to_string(threads)}})
                                      .pipe_input(true)
                                      .pipe_output(true));
    in_ = fdopen(child_.take_stdin(), "w");
    out_ = fdopen(child_.take_stdout(), "r");
    err_fd_ = child_.take_stderr();
    // DeepSpeed logs to standard output while it loads; the peer's own first line starts with "ready ".
    std::string ready;
    std::string before;
    while (!(ready = read_line()).empty() || !std::feof(out_)) {
      if (ready.rfind("ready ", 0) == 0) break;
      before += ready + "\n";
    }
    if (ready.rfind("ready ", 0) != 0) {
      child_.kill(SIGKILL);
      throw std::runtime_error(fmt::format("{} {}: the DeepSpeed peer ended before it was ready ({}); its output:\n{}{}",
                                           python, script, child_.wait().to_string(), before, read_stderr()));
    }
    description_ = ready.substr(6);
  }
  DeepSpeedPeer(const DeepSpeedPeer&) = delete;
  DeepSpeedPeer& operator=(const DeepSpeedPeer&) = delete;
  ~DeepSpeedPeer() {
    if (in_ != nullptr) std::fclose(in_);  // end of file: the peer exits
    if (out_ != nullptr) std::fclose(out_);
    if (err_fd_ >= 0) ::close(err_fd_);
    child_.wait();
  }
  /// "deepspeed 0.19.8 -D__AVX512__": the peer's version and the SIMD width of its compiled op.
  const std::string& description() const { return description_; }
  double step() {
    std::fputs("step\n", in_);
    std::fflush(in_);
    const std::string line = read_line();
    try {
      return std::stod(line);
    } catch (const std::exception&) {
      throw std::runtime_error("the DeepSpeed peer answered '" + line + "' to a step; its stderr:\n" + read_stderr());
    }
  }

 private:
  std::string read_line() {
    std::string line;
    for (int ch; (ch = std::fgetc(out_)) != EOF && ch != '\n';) line.push_back(static_cast<char>(ch));
    return line;
  }
  std::string read_stderr() {
    std::string text;
    char buffer[4096];
    for (ssize_t n; err_fd_ >= 0 && (n = ::read(err_fd_, buffer, sizeof buffer)) > 0;) {
      text.append(buffer, static_cast<size_t>(n));
    }
    return text;
  }
  trainkit::Subprocess child_;
  std::FILE* in_ = nullptr;
  std::FILE* out_ = nullptr;
  int err_fd_ = -1;
  std::string description_;
};

int bench_main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "Optimizer step time: trainkit (fused / reference) vs torch::optim vs at::_fused_adam_ vs a floor"};
  int rounds = 15;
  int threads = 0;
  std::string json_path;
  std::vector<std::string> only;
  std::vector<std::string> variants_only;
  cli.option("--rounds", rounds, "Interleaved rounds per case (median reported)").show_default();
  cli.option("--threads", threads, "Intra-op threads (0 = LibTorch's default)").show_default();
  cli.option("--cases", only, "Run only these cases (10M/16, 1M/256, 64M/16)");
  bool no_reference = false;
  cli.flag("--no-reference", no_reference, "Skip the slow ATen reference paths of trainkit's optimizers");
  cli.option("--variants", variants_only, "Run only variants whose name contains one of these strings");
  cli.option("--json", json_path, "Also write the results as JSON");
  std::string device = "cpu";
  cli.option("--device", device, "cpu, or cuda: the paths that run on a GPU").show_default();
  bool deepspeed = false;
  cli.flag("--deepspeed", deepspeed, "Add DeepSpeed's DeepSpeedCPUAdam (a Python peer; needs deepspeed installed)");
  std::string python = std::string(TRAINKIT_SOURCE_DIR) + "/.venv/bin/python";
  cli.option("--python", python, "Python with the pinned torch and deepspeed (the peer)").show_default();
  std::vector<int64_t> sizes;
  cli.option("--size", sizes, "Instead of the cases: one case of TOTAL parameters in COUNT tensors (e.g. 4096 4)");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  if (threads > 0) {
    torch::set_num_threads(threads);
  }
  torch::NoGradGuard no_grad;
  std::vector<Case> cases{Case{"10M/16", 10'000'000, 16}, Case{"1M/256", 1'048'576, 256}, Case{"64M/16", 64'000'000, 16}};
  if (sizes.size() == 2) {
    cases = {Case{fmt::format("{}/{}", sizes[0], sizes[1]), sizes[0], sizes[1]}};
  } else if (!sizes.empty()) {
    fmt::print(stderr, "--size takes two numbers: TOTAL COUNT\n");
    return 2;
  }
  if (device != "cpu") {
    const c10::Device dev(device);
    if (dev.is_cuda() && !torch::cuda::is_available()) {
      fmt::print(stderr, "--device {}: CUDA is not available\n", device);
      return 2;
    }
    std::vector<Case> chosen;
    for (const Case& c : cases) {
      if (only.empty() || std::find(only.begin(), only.end(), c.name) != only.end()) {
        chosen.push_back(c);
      }
    }
    run_on_device(chosen, dev, rounds);
    return 0;
  }
  // How many threads the kernels really run on (a kernel compiled without OpenMP's at::parallel_for ran on one).
  std::vector<int> thread_seen(static_cast<size_t>(torch::get_num_threads()), 0);
  trainkit::detail::parallel_range(0, torch::get_num_threads(), 1, [&](int64_t, int64_t) {
    thread_seen[static_cast<size_t>(at::get_thread_num())] = 1;
  });
  fmt::print("Optimizer step, float32 CPU, {} threads ({} of them run the kernels), median of {} interleaved "
             "rounds (1 warm-up), milliseconds\n",
             torch::get_num_threads(), std::count(thread_seen.begin(), thread_seen.end(), 1), rounds);

  std::string json = fmt::format("{{\"threads\": {}, \"rounds\": {}, \"cases\": [", torch::get_num_threads(), rounds);
  std::vector<std::string> goal_lines;
  std::vector<std::string> ratio_lines;
  bool first_case = true;
  for (const Case& c : cases) {
    if (!only.empty() && std::find(only.begin(), only.end(), c.name) == only.end()) {
      continue;
    }
    std::vector<at::Tensor> grads;
    const std::vector<at::Tensor> params = case_params(c, torch::TensorOptions(), grads);
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
    if (!no_reference) {
      optimizers.emplace_back("trainkit Adam reference", std::make_unique<Adam>(params, AdamOptions(1e-3).fused(false)));
    }
    optimizers.emplace_back("trainkit Adam aten_fused", std::make_unique<Adam>(params, AdamOptions(1e-3).aten_fused(true)));
    optimizers.emplace_back("trainkit AdamW fused", std::make_unique<AdamW>(params, AdamWOptions(1e-3)));
    optimizers.emplace_back("trainkit AdamW aten_fused",
                            std::make_unique<AdamW>(params, AdamWOptions(1e-3).aten_fused(true)));
    optimizers.emplace_back("trainkit SGD-momentum fused", std::make_unique<Sgd>(params, SgdOptions(1e-3).momentum(0.9)));
    optimizers.emplace_back("trainkit SGD-momentum aten_fused",
                            std::make_unique<Sgd>(params, SgdOptions(1e-3).momentum(0.9).aten_fused(true)));
    if (!no_reference) {
      optimizers.emplace_back("trainkit SGD-momentum reference",
                              std::make_unique<Sgd>(params, SgdOptions(1e-3).momentum(0.9).fused(false)));
    }
    optimizers.emplace_back("trainkit LARS fused",
                            std::make_unique<Lars>(params, LarsOptions(0.1).momentum(0.9).weight_decay(1e-4)));
    if (!no_reference) {
      optimizers.emplace_back(
          "trainkit LARS reference",
          std::make_unique<Lars>(params, LarsOptions(0.1).momentum(0.9).weight_decay(1e-4).fused(false)));
    }
    optimizers.emplace_back("trainkit LAMB fused", std::make_unique<Lamb>(params, LambOptions(1e-3)));
    if (!no_reference) {
      optimizers.emplace_back("trainkit LAMB reference", std::make_unique<Lamb>(params, LambOptions(1e-3).fused(false)));
    }
    // The multi-tensor path (what non-CPU tensors take by default); on the CPU ATen runs each _foreach_ op
    // tensor by tensor.
    optimizers.emplace_back("trainkit Adam foreach", std::make_unique<Adam>(params, AdamOptions(1e-3).foreach(true)));
    optimizers.emplace_back("trainkit SGD-momentum foreach",
                            std::make_unique<Sgd>(params, SgdOptions(1e-3).momentum(0.9).foreach(true)));
    optimizers.emplace_back("trainkit LARS foreach", std::make_unique<Lars>(params, LarsOptions(0.1).momentum(0.9)
                                                                                      .weight_decay(1e-4)
                                                                                      .foreach(true)));
    optimizers.emplace_back("trainkit LAMB foreach", std::make_unique<Lamb>(params, LambOptions(1e-3).foreach(true)));
    // The rest of torch.optim, Lion and Adafactor at their default options (Adagrad, Adadelta, ASGD, Rprop,
    // Adafactor: PyTorch's/timm's default lr). Paths: fused (where the optimizer has a fused CPU kernel),
    // foreach (the `_foreach_*` op sequence of torch.optim's foreach=True implementation, which is PyTorch's
    // fastest path for these on the CPU: it has no fused CPU kernel for them) and reference (per tensor).
    const auto add_paths = [&](const std::string& name, auto make, bool has_fused) {
      using Opt = typename decltype(make(std::nullopt, std::nullopt))::element_type;
      if (has_fused) {
        optimizers.emplace_back("trainkit " + name + " fused", std::unique_ptr<Opt>(make(true, std::nullopt)));
      }
      optimizers.emplace_back("trainkit " + name + " foreach", std::unique_ptr<Opt>(make(std::nullopt, true)));
      if (!no_reference) {
        optimizers.emplace_back("trainkit " + name + " reference", std::unique_ptr<Opt>(make(false, false)));
      }
    };
    // fused: unset / true / false; foreach: unset / true / false (the reference path is neither).
    using Flag = std::optional<bool>;
    const auto fusable = [&](auto options, auto* tag) {
      using Opt = std::remove_pointer_t<decltype(tag)>;
      return [&params, options](Flag fused, Flag foreach) {
        auto o = options;
        if (fused) o.fused(*fused);
        if (foreach) o.foreach(*foreach);
        return std::make_unique<Opt>(params, o);
      };
    };
    const auto unfused = [&](auto options, auto* tag) {
      using Opt = std::remove_pointer_t<decltype(tag)>;
      return [&params, options](Flag, Flag foreach) {
        auto o = options;
        if (foreach) o.foreach(*foreach);
        return std::make_unique<Opt>(params, o);
      };
    };
    add_paths("RAdam", fusable(RAdamOptions(), static_cast<RAdam*>(nullptr)), true);
    add_paths("NAdam", fusable(NAdamOptions(), static_cast<NAdam*>(nullptr)), true);
    add_paths("Adamax", fusable(AdamaxOptions(), static_cast<Adamax*>(nullptr)), true);
    add_paths("Adagrad", fusable(AdagradOptions(), static_cast<Adagrad*>(nullptr)), true);
    add_paths("Lion", fusable(LionOptions(), static_cast<Lion*>(nullptr)), true);
    add_paths("Adadelta", unfused(AdadeltaOptions(), static_cast<Adadelta*>(nullptr)), false);
    add_paths("ASGD", unfused(AsgdOptions(), static_cast<Asgd*>(nullptr)), false);
    add_paths("Rprop", unfused(RpropOptions(), static_cast<Rprop*>(nullptr)), false);
    if (!no_reference) {  // Adafactor has only the reference path (timm's has no foreach either)
      optimizers.emplace_back("trainkit Adafactor reference", std::make_unique<Adafactor>(params, AdafactorOptions()));
    }
    optimizers.emplace_back("torch::optim::Adagrad",
                            std::make_unique<torch::optim::Adagrad>(params, torch::optim::AdagradOptions(1e-2)));
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
    // PyTorch's fused CPU Adagrad, called as torch.optim.Adagrad(fused=True) calls it (its defaults: lr 1e-2).
    std::vector<at::Tensor> adagrad_sums = zeros();
    std::vector<at::Tensor> adagrad_steps;
    for (size_t i = 0; i < params.size(); ++i) {
      adagrad_steps.push_back(torch::zeros({}));
    }

    // bfloat16 parameters: the same values rounded, for trainkit's AdamW (float32 state) and PyTorch's
    // _fused_adamw_ (bfloat16 state, as torch.optim.AdamW(fused=True) keeps it).
    std::vector<at::Tensor> bf_params;
    std::vector<at::Tensor> bf_grads;
    std::vector<at::Tensor> bf_m;
    std::vector<at::Tensor> bf_v;
    std::vector<at::Tensor> bf_steps;
    for (const auto& p : params) {
      at::Tensor q = p.detach().to(at::kBFloat16).requires_grad_();
      q.mutable_grad() = p.grad().to(at::kBFloat16);
      bf_params.push_back(q);
      bf_grads.push_back(q.grad());
      bf_m.push_back(torch::zeros_like(q));
      bf_v.push_back(torch::zeros_like(q));
      bf_steps.push_back(torch::zeros({}));
    }
    AdamW bf_adamw(bf_params, AdamWOptions(1e-3));
    AdamW bf_adamw_lowp(bf_params, AdamWOptions(1e-3));
    state_in_param_dtype(bf_adamw_lowp, bf_params);
    AtenFused aten_bf{bf_m, bf_v, bf_steps, true};
    // Placement controls: each kernel on the other's state tensors, to tell the kernel's speed from that of
    // the memory its buffers happen to occupy.
    Adam adam_on_aten_state(params, AdamOptions(1e-3));
    set_adam_state(adam_on_aten_state, params, aten_adam.m, aten_adam.v);
    std::vector<at::Tensor> own_m;
    std::vector<at::Tensor> own_v;
    for (const auto& p : params) {
      own_m.push_back(torch::zeros_like(p));
      own_v.push_back(torch::zeros_like(p));
    }
    Adam adam_on_own_state(params, AdamOptions(1e-3));
    set_adam_state(adam_on_own_state, params, own_m, own_v);
    AtenFused aten_on_own_state{own_m, own_v, steps_a, false};
    Adam scaled_adam(params, AdamOptions(1e-3));
    Adam scaled_aten_adam(params, AdamOptions(1e-3).aten_fused(true));
    Adam chunk_adam(params, AdamOptions(1e-3));
    Adam before_adam(params, AdamOptions(1e-3));
    Sgd chunk_sgd(params, SgdOptions(1e-3).momentum(0.9));
    Adam per_tensor_adam(params, AdamOptions(1e-3));
    Sgd per_tensor_sgd(params, SgdOptions(1e-3).momentum(0.9));
    trainkit::amp::GradScaler scaler(torch::kCPU, trainkit::amp::GradScalerOptions().init_scale(1.0));
    const at::Tensor dummy = torch::ones({}, torch::requires_grad());
    Stream stream{torch::ones({c.total}), torch::ones({c.total}), torch::ones({c.total})};

    std::vector<std::pair<std::string, std::function<void()>>> variants;
    variants.emplace_back("stream copy", [&] { stream.copy(); });
    variants.emplace_back("stream triad", [&] { stream.triad(); });
    variants.emplace_back("floor (same bytes as Adam)", [&] { floor_step(params, floor); });
    variants.emplace_back("at::_fused_adam_", [&] { aten_adam.step(params, grads); });
    variants.emplace_back("at::_fused_adamw_", [&] { aten_adamw.step(params, grads); });
    variants.emplace_back("at::_fused_adagrad_", [&] {
      for (auto& t : adagrad_steps) {
        t.add_(1);
      }
      at::_fused_adagrad_(params, grads, adagrad_sums, adagrad_steps, 1e-2, 0.0, 0.0, 1e-10, false);
    });
    for (auto& [name, opt] : optimizers) {
      torch::optim::Optimizer* o = opt.get();
      variants.emplace_back(name, [o] { o->step(); });
    }
    variants.emplace_back("trainkit Adam fused + GradScaler", [&] {
      scaler.scale(dummy);  // marks the scaler as in use; the gradients already carry scale 1
      scaler.step(scaled_adam);  // read-only inf check, unscale inside the fused pass
      scaler.update();
    });
    variants.emplace_back("trainkit Adam aten_fused + GradScaler", [&] {
      scaler.scale(dummy);
      scaler.step(scaled_aten_adam);  // inf check, then scale and found_inf handed to _fused_adam_
      scaler.update();
    });
    // The same kernels with the old chunk split, and as they ran before (baseline x86-64 build, chunk split).
    using trainkit::detail::SplitMode;
    const auto with_choices = [](bool avx2, SplitMode split, torch::optim::Optimizer& o) {
      trainkit::detail::set_kernel_choices(avx2, split);
      o.step();
      trainkit::detail::set_kernel_choices(true, SplitMode::kContiguous);
    };
    variants.emplace_back("trainkit Adam fused, chunk split", [&] { with_choices(true, SplitMode::kChunks, chunk_adam); });
    variants.emplace_back("trainkit Adam fused, per-tensor split",
                          [&] { with_choices(true, SplitMode::kPerTensor, per_tensor_adam); });
    variants.emplace_back("trainkit SGD-mom. fused, chunk split", [&] { with_choices(true, SplitMode::kChunks, chunk_sgd); });
    variants.emplace_back("trainkit SGD-mom. fused, per-tensor split",
                          [&] { with_choices(true, SplitMode::kPerTensor, per_tensor_sgd); });
    variants.emplace_back("trainkit Adam fused, as before", [&] { with_choices(false, SplitMode::kChunks, before_adam); });
    variants.emplace_back("trainkit Adam fused, on ATen's m, v", [&] { adam_on_aten_state.step(); });
    variants.emplace_back("trainkit Adam fused, on shared m, v", [&] { adam_on_own_state.step(); });
    variants.emplace_back("at::_fused_adam_, on shared m, v", [&] { aten_on_own_state.step(params, grads); });
    variants.emplace_back("trainkit AdamW fused bf16", [&] { bf_adamw.step(); });
    variants.emplace_back("trainkit AdamW fused bf16, bf16 state", [&] { bf_adamw_lowp.step(); });
    variants.emplace_back("at::_fused_adamw_ bf16", [&] { aten_bf.step(bf_params, bf_grads); });
    // A variant that times itself (the peer process) sets `reported` to its own step time in seconds.
    double reported = -1;
    std::unique_ptr<DeepSpeedPeer> peer;
    if (deepspeed) {
      peer = std::make_unique<DeepSpeedPeer>(python, c, torch::get_num_threads());
      fmt::print("DeepSpeedCPUAdam peer: {}, OMP_NUM_THREADS={}\n", peer->description(), torch::get_num_threads());
      // OpenMP threads keep spinning after their last loop (LLVM's libomp, which the fused kernels' source
      // runs on when clang builds it, for 200 ms: KMP_BLOCKTIME), taking the cores from another process's
      // work: a pause on either side of the peer's step lets each side's threads go to sleep first.
      variants.emplace_back("DeepSpeedCPUAdam (peer)", [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        reported = peer->step();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      });
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
        reported = -1;
        const auto start = Clock::now();
        step();
        const double wall = std::chrono::duration<double>(Clock::now() - start).count();
        const double s = reported >= 0 ? reported : wall;
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
    // Bytes per parameter each variant must move (every stream read or written once); 0 = not memory-bound
    // or not meaningful (the ATen reference paths move several times more through temporaries).
    const auto bytes_per_param = [](const std::string& name) -> double {
      if (name == "stream copy") {
        return 8;
      }
      if (name == "stream triad") {
        return 12;
      }
      if (name.find("reference") != std::string::npos || name.rfind("torch::optim::Adam", 0) == 0 ||
          name.find("as before") != std::string::npos) {
        return 0;
      }
      if (name.find("bf16") != std::string::npos) {
        // p and g bfloat16 (2+2+2), m and v float32 (8+8) for trainkit; all bfloat16 (2+2+2+4+4) for ATen.
        return name.rfind("trainkit", 0) == 0 && name.find("bf16 state") == std::string::npos ? 22 : 14;
      }
      if (name.find("Adagrad") != std::string::npos || name.find("adagrad") != std::string::npos ||
          name.find("Lion") != std::string::npos) {
        return 20;  // read p, g, one state tensor; write p and it
      }
      if (name.find("Adadelta") != std::string::npos || name.find("ASGD") != std::string::npos ||
          name.find("Rprop") != std::string::npos || name.find("Adafactor") != std::string::npos) {
        return 0;  // foreach/reference paths only: several passes through temporaries
      }
      if (name.find("SGD") != std::string::npos || name.find("LARS") != std::string::npos) {  // incl. "SGD-mom."
        return 20;  // read p, g, buf; write p, buf
      }
      if (name.find("LAMB") != std::string::npos || name.find("GradScaler") != std::string::npos) {
        return 32;  // Adam's 28 + one more read of g (LAMB's global clip norm, the scaler's inf check)
      }
      return 28;  // read p, g, m, v; write p, m, v
    };
    const double triad_bw = 12.0 * static_cast<double>(c.total) / (ms["stream triad"] * 1e-3);
    const auto fraction = [&](const std::string& name) {
      const double b = bytes_per_param(name);
      return b > 0 && ms.count(name) ? b * static_cast<double>(c.total) / (ms[name] * 1e-3) / triad_bw : std::nan("");
    };
    fmt::print("\n{} ({} params in {} tensors); triad {:.1f} GB/s, copy {:.1f} GB/s\n", c.name, c.total, c.count,
               triad_bw * 1e-9, 8.0 * static_cast<double>(c.total) / (ms["stream copy"] * 1e-3) * 1e-9);
    fmt::print("{:<42} {:>10} {:>16} {:>8} {:>10}\n", "variant", "ms", "× trainkit Adam", "B/param", "of triad");
    json += fmt::format("{}{{\"case\": \"{}\", \"ms\": {{", first_case ? "" : ", ", c.name);
    bool first = true;
    for (const auto& [name, step] : variants) {
      const double f = fraction(name);
      fmt::print("{:<42} {:>10.2f} {:>16.2f} {:>8} {:>10}\n", name, ms[name], ms[name] / adam,
                 bytes_per_param(name) > 0 ? fmt::format("{:.0f}", bytes_per_param(name)) : "-",
                 std::isnan(f) ? "-" : fmt::format("{:.2f}", f));
      json += fmt::format("{}\"{}\": {:.4f}", first ? "" : ", ", name, ms[name]);
      first = false;
    }
    json += "}}";
    first_case = false;

    // Equal results? Ten steps of trainkit's bf16 AdamW (float32 state, and state in bf16 as PyTorch keeps it)
    // and _fused_adamw_ from the same values; parameters compared element by element.
    if (ms.count("trainkit AdamW fused bf16") && ms.count("at::_fused_adamw_ bf16")) {
      const auto run_mine = [&](bool lowp_state) {
        std::vector<at::Tensor> pa;
        for (size_t i = 0; i < params.size() && i < 4; ++i) {
          at::Tensor q = params[i].detach().to(at::kBFloat16).requires_grad_();
          q.mutable_grad() = params[i].grad().to(at::kBFloat16);
          pa.push_back(q);
        }
        AdamW mine(pa, AdamWOptions(1e-3));
        if (lowp_state) {
          state_in_param_dtype(mine, pa);
        }
        for (int k = 0; k < 10; ++k) {
          mine.step();
        }
        return pa;
      };
      std::vector<at::Tensor> pb;
      std::vector<at::Tensor> gb;
      std::vector<at::Tensor> mb;
      std::vector<at::Tensor> vb;
      std::vector<at::Tensor> sb;
      for (size_t i = 0; i < params.size() && i < 4; ++i) {
        pb.push_back(params[i].detach().to(at::kBFloat16));
        gb.push_back(params[i].grad().to(at::kBFloat16));
        mb.push_back(torch::zeros_like(pb.back()));
        vb.push_back(torch::zeros_like(pb.back()));
        sb.push_back(torch::zeros({}));
      }
      AtenFused theirs{mb, vb, sb, true};
      for (int k = 0; k < 10; ++k) {
        theirs.step(pb, gb);
      }
      for (const bool lowp_state : {false, true}) {
        const auto pa = run_mine(lowp_state);
        int64_t differ = 0;
        int64_t total = 0;
        double worst = 0;
        for (size_t i = 0; i < pa.size(); ++i) {
          const auto a = pa[i].detach().to(at::kFloat);
          const auto b = pb[i].to(at::kFloat);
          differ += (a != b).sum().item<int64_t>();
          total += a.numel();
          worst = std::max(worst, ((a - b).abs() / (b.abs() + 1e-30)).max().item<double>());
        }
        fmt::print("bf16 AdamW after 10 steps, trainkit ({} state) vs _fused_adamw_: {} of {} parameters differ, "
                   "max rel. {:.2e}\n",
                   lowp_state ? "bf16" : "float32", differ, total, worst);
      }
    }

    const auto goal = [&](const std::string& what, double ratio, const std::string& cmp, double target) {
      if (!std::isfinite(ratio) || ratio <= 0) {
        return;  // a variant of the ratio was not run
      }
      const bool met = cmp == ">=" ? ratio >= target : ratio <= target;
      goal_lines.push_back(fmt::format("{:<8} {:<52} {:>6.2f}  goal {} {:<5} {}", c.name, what, ratio, cmp, target,
                                       met ? "met" : "NOT met"));
    };
    const auto ratio = [&](const std::string& a, const std::string& b) {
      if (ms.count(a) && ms.count(b)) {
        ratio_lines.push_back(fmt::format("{:<8} {:<72} {:>6.2f}", c.name, a + " / " + b, ms[a] / ms[b]));
      }
    };
    ratio("trainkit Adam aten_fused", "trainkit Adam fused");
    ratio("trainkit Adam aten_fused", "torch::optim::Adam");
    ratio("trainkit AdamW aten_fused", "trainkit AdamW fused");
    ratio("trainkit SGD-momentum aten_fused", "trainkit SGD-momentum fused");
    ratio("trainkit SGD-momentum aten_fused", "torch::optim::SGD-momentum");
    ratio("trainkit Adam aten_fused + GradScaler", "trainkit Adam fused + GradScaler");
    ratio("trainkit Adam foreach", "trainkit Adam fused");
    ratio("trainkit Adam foreach", "torch::optim::Adam");
    ratio("trainkit SGD-momentum foreach", "trainkit SGD-momentum fused");
    ratio("trainkit SGD-momentum foreach", "torch::optim::SGD-momentum");
    ratio("trainkit LARS foreach", "trainkit LARS fused");
    ratio("trainkit LAMB foreach", "trainkit LAMB fused");
    for (const char* name : {"RAdam", "NAdam", "Adamax", "Adagrad", "Lion"}) {
      ratio(fmt::format("trainkit {} foreach", name), fmt::format("trainkit {} fused", name));
      ratio(fmt::format("trainkit {} fused", name), "trainkit Adam fused");
    }
    ratio("torch::optim::Adagrad", "trainkit Adagrad fused");
    ratio("trainkit Adagrad fused", "at::_fused_adagrad_");
    if (c.name == "10M/16") {
      goal("torch::optim::Adam / trainkit fused Adam", ms["torch::optim::Adam"] / adam, ">=", 4.0);
    }
    if (c.name == "1M/256") {
      goal("torch::optim::Adam / trainkit fused Adam", ms["torch::optim::Adam"] / adam, ">=", 10.0);
    }
    goal("trainkit fused Adam / at::_fused_adam_", adam / ms["at::_fused_adam_"], "<=", 1.0);
    if (c.name != "1M/256") {
      goal("trainkit fused Adam / DeepSpeedCPUAdam", adam / ms["DeepSpeedCPUAdam (peer)"], "<=", 1.0);
    }
    goal("trainkit fused AdamW / at::_fused_adamw_", ms["trainkit AdamW fused"] / ms["at::_fused_adamw_"], "<=", 1.0);
    if (c.name == "64M/16") {
      goal("trainkit fused Adam / floor", adam / ms["floor (same bytes as Adam)"], "<=", 1.2);
    }
    goal("LARS fused / SGD-momentum fused", ms["trainkit LARS fused"] / ms["trainkit SGD-momentum fused"], "<=", 1.5);
    goal("LAMB fused / Adam fused", ms["trainkit LAMB fused"] / adam, "<=", 2.0);
    goal("Adagrad fused / at::_fused_adagrad_", ms["trainkit Adagrad fused"] / ms["at::_fused_adagrad_"], "<=", 1.0);
    for (const char* name : {"RAdam", "NAdam", "Adamax", "Adagrad", "Lion"}) {
      goal(fmt::format("{} fused / {} foreach (PyTorch's path)", name, name),
           ms[fmt::format("trainkit {} fused", name)] / ms[fmt::format("trainkit {} foreach", name)], "<=", 0.5);
    }
    goal("SGD-momentum fused / torch::optim::SGD-momentum",
         ms["trainkit SGD-momentum fused"] / ms["torch::optim::SGD-momentum"], "<=", 1.0);
    goal("Adam fused + GradScaler / Adam fused", ms["trainkit Adam fused + GradScaler"] / adam, "<=", 1.1);
    goal("AdamW fused bf16 / at::_fused_adamw_ bf16", ms["trainkit AdamW fused bf16"] / ms["at::_fused_adamw_ bf16"],
         "<=", 1.0);
    goal("AdamW fused bf16, bf16 state / at::_fused_adamw_ bf16",
         ms["trainkit AdamW fused bf16, bf16 state"] / ms["at::_fused_adamw_ bf16"], "<=", 1.0);
    if (c.name == "64M/16") {
      for (const auto& [name, step] : variants) {
        if (name.find("fused") != std::string::npos && name.rfind("trainkit", 0) == 0 &&
            name.find(", ") == std::string::npos && name.find("aten_fused") == std::string::npos &&
            name.find("foreach") == std::string::npos) {
          goal(name + ": fraction of triad", fraction(name), ">=", 0.85);
        }
      }
    }
  }
  json += "]}\n";
  fmt::print("\nRatios without a goal (trainkit's aten_fused and foreach paths)\n");
  for (const auto& line : ratio_lines) {
    fmt::print("{}\n", line);
  }
  fmt::print("\nGoals (ratios from this run)\n");
  for (const auto& line : goal_lines) {
    fmt::print("{}\n", line);
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << json;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return trainkit::app::run_main([&] { return bench_main(argc, argv); });
}
