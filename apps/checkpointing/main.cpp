// checkpointing: a deep MLP of n residual-free blocks (Linear(W, 2W) → ReLU → Linear(2W, W) → ReLU) trained
// one step at a time without checkpointing, with every block checkpointed, and with checkpoint_sequential in
// √n segments (Chen et al. 2016, arXiv 1604.06174). Prints peak activation memory and step time of each.
//
// The weights get He's initialization (kaiming_normal, fan_in, ReLU gain; biases zero), which keeps the
// activations' and the gradients' scale through any depth. With LibTorch's default init the gradients
// reaching the first blocks shrink geometrically with depth and become subnormal floats, whose arithmetic
// runs many times slower on x86: the step time then measures that, not recomputation. The app prints the
// first block's gradient RMS to show it does not happen.
//
// Memory is measured, not estimated: the app installs a counting wrapper around LibTorch's CPU allocator and
// reports the peak of the bytes live in it during one step (forward + backward), minus the bytes live when the
// step starts (parameters, gradients kept from the warm-up step, the batch). That is every tensor the step
// allocates on the CPU: saved activations, recomputed activations, and backward's temporaries.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/stats.h"
#include "trainkit/nn/activation_checkpoint.h"
#include "trainkit/nn/init.h"

namespace {

/// Wraps the CPU allocator; counts the bytes live in it and their peak.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* context = new Context{std::move(inner), n, this};
    const int64_t now = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, context, &CountingAllocator::release, device};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { inner_->copy_data(dest, src, count); }

  int64_t live() const { return live_.load(); }
  /// Starts a new peak from the bytes live now.
  void reset_peak() { peak_.store(live_.load()); }
  int64_t peak() const { return peak_.load(); }

 private:
  struct Context {
    c10::DataPtr inner;
    size_t bytes;
    CountingAllocator* owner;
  };
  static void release(void* ctx) {
    auto* context = static_cast<Context*>(ctx);
    context->owner->live_.fetch_sub(static_cast<int64_t>(context->bytes));
    delete context;  // frees the inner allocation
  }
  c10::Allocator* inner_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

CountingAllocator* install_counting_allocator() {
  static CountingAllocator counter(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&counter, /*priority=*/std::numeric_limits<uint8_t>::max());
  return &counter;
}

/// Linear(W, 2W) → ReLU → Linear(2W, W) → ReLU: it keeps 3 activations of B×W floats (its input and the two
/// ReLU outputs; the last is the next block's input) for backward.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width)
      : up(register_module("up", torch::nn::Linear(width, 2 * width))),
        down(register_module("down", torch::nn::Linear(2 * width, width))) {}
  at::Tensor forward(const at::Tensor& x) { return torch::relu(down->forward(torch::relu(up->forward(x)))); }
  torch::nn::Linear up;
  torch::nn::Linear down;
};
TORCH_MODULE(Block);

torch::nn::Sequential make_net(int64_t blocks, int64_t width) {
  torch::nn::Sequential net;
  for (int64_t i = 0; i < blocks; ++i) {
    net->push_back(Block(width));
  }
  trainkit::nn::init::apply(*net, trainkit::nn::init::scheme("kaiming_normal"));
  return net;
}

struct Variant {
  std::string name;
  int64_t segments;  // 0: no checkpointing
};

struct Measure {
  double activation_mib = 0;
  std::vector<double> seconds;
};

using trainkit::app::median;

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "Activation checkpointing: peak activation memory and step time of a deep MLP, without, per block, "
      "and with checkpoint_sequential in sqrt(n) segments"};
  std::vector<int64_t> depths{16, 64};
  int64_t width = 128;
  int64_t batch = 512;
  int64_t rounds = 7;
  int threads = 0;
  cli.option("--blocks", depths, "Network depths n (blocks of Linear(W,2W)-ReLU-Linear(2W,W)-ReLU)").show_default()
      .delimiter(',');
  cli.option("--width", width, "Block width W").show_default().positive();
  cli.option("--batch", batch, "Batch size").show_default().positive();
  cli.option("--rounds", rounds, "Timed steps per variant (interleaved; medians reported)").show_default().positive();
  cli.option("--threads", threads, "Intra-op threads (0 = LibTorch's default)").show_default();
  if (auto rc = cli.parse(argc, argv)) return *rc;
  if (threads > 0) {
    torch::set_num_threads(threads);
  }
  CountingAllocator* counter = install_counting_allocator();

  fmt::print("memory: peak bytes live in LibTorch's CPU allocator during one step (forward + backward) minus the "
             "bytes live at its start (parameters, gradients, batch): saved and recomputed activations and "
             "backward's temporaries\n");
  fmt::print("time: median of {} steps per variant, variants interleaved; {} intra-op threads\n\n", rounds,
             torch::get_num_threads());
  fmt::print("{:>4} {:<30} {:>10} {:>8} {:>10} {:>8}\n", "n", "variant", "act. MiB", "ratio", "step ms", "ratio");
  for (const int64_t n : depths) {
    const auto root = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(n))));
    const std::vector<Variant> variants = {{"no checkpointing", 0},
                                           {fmt::format("checkpoint every block ({})", n), n},
                                           {fmt::format("checkpoint_sequential, {} seg.", root), root}};
    torch::manual_seed(0);
    auto net = make_net(n, width);
    const at::Tensor x = torch::randn({batch, width});
    const at::Tensor target = torch::randn({batch, width});
    const auto step = [&](const Variant& v) {
      for (auto& p : net->parameters()) {
        if (p.grad().defined()) {
          p.mutable_grad().zero_();  // kept allocated, so gradients are not counted as the step's memory
        }
      }
      const at::Tensor out = v.segments == 0 ? net->forward(x) : trainkit::nn::checkpoint_sequential(net, v.segments, x);
      torch::mse_loss(out, target).backward();
    };
    std::vector<Measure> measures(variants.size());
    std::vector<at::Tensor> reference;
    for (size_t i = 0; i < variants.size(); ++i) {
      step(variants[i]);  // warm-up: allocates the gradients
      const int64_t before = counter->live();
      counter->reset_peak();
      step(variants[i]);
      measures[i].activation_mib = static_cast<double>(counter->peak() - before) / (1 << 20);
      // Checkpointing must not change the result: every variant's gradients equal the plain step's, bitwise.
      const auto params = net->parameters();
      for (size_t k = 0; k < params.size(); ++k) {
        if (i == 0) {
          reference.push_back(params[k].grad().clone());
        } else if (!torch::equal(params[k].grad(), reference[k])) {
          fmt::print(stderr, "error: n = {}, {}: gradient of parameter {} differs from the plain step's\n", n,
                     variants[i].name, k);
          return 1;
        }
      }
    }
    for (int64_t r = 0; r < rounds; ++r) {
      for (size_t i = 0; i < variants.size(); ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        step(variants[i]);
        measures[i].seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    const double base_mib = measures[0].activation_mib;
    const double base_s = median(measures[0].seconds);
    for (size_t i = 0; i < variants.size(); ++i) {
      const double s = median(measures[i].seconds);
      fmt::print("{:>4} {:<30} {:>10.1f} {:>8.3f} {:>10.1f} {:>8.2f}\n", n, variants[i].name, measures[i].activation_mib,
                 measures[i].activation_mib / base_mib, 1e3 * s, s / base_s);
    }
    fmt::print("{:>4} gradients of every variant bitwise equal to the plain step's; first block's weight gradient "
               "RMS {:.2e} (last block's {:.2e})\n",
               n, reference.front().pow(2).mean().sqrt().item<double>(),
               reference[reference.size() - 2].pow(2).mean().sqrt().item<double>());
    fmt::print("{:>4} goal for sqrt(n) segments (Chen et al. 2016): memory ratio <= 2/sqrt(n) = {:.3f}, time ratio "
               "<= 1.4\n\n",
               n, 2.0 / std::sqrt(static_cast<double>(n)));
  }
  return 0;
}
