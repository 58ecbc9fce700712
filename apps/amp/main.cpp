// amp: mixed precision on Fashion-MNIST. Trains the CNN with autocast next to float32 from the same weights
// and data (bfloat16 on the CPU, float16 + GradScaler with --device cuda; --dtypes chooses, e.g. both on a
// GPU), then shows a GradScaler's scale trajectory with an injected overflow that is skipped.
#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/main.h"
#include "trainkit/amp/autocast.h"
#include "trainkit/amp/grad_scaler.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/nn/models.h"

namespace {

using Clock = std::chrono::steady_clock;

struct RunResult {
  double seconds = 0;
  double final_loss = 0;
  double test_accuracy = 0;
};

/// Trains `steps` steps and evaluates on `test` (none when `test` is null, as in the warm-up runs).
RunResult run(const trainkit::data::ImageSet& train, const trainkit::data::ImageSet* test, torch::Device device,
              std::optional<c10::ScalarType> autocast_dtype, bool scaler_on, int64_t steps) {
  torch::manual_seed(0);
  auto model = trainkit::nn::make_cnn();
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  trainkit::amp::GradScaler scaler(device, trainkit::amp::GradScalerOptions().enabled(scaler_on));
  trainkit::data::TensorLoader loader(train.images.to(device), train.labels.to(device),
                                      trainkit::data::TensorLoaderOptions().batch_size(128).seed(0));
  RunResult r;
  const auto start = Clock::now();
  double loss_sum = 0;
  for (int64_t s = 0; s < steps; ++s) {
    if (s % loader.num_batches() == 0) {
      loader.set_epoch(s / loader.num_batches());
    }
    const auto b = loader.batch(s % loader.num_batches());
    opt.zero_grad();
    at::Tensor loss;
    {
      std::optional<trainkit::amp::Autocast> guard;
      if (autocast_dtype) {
        guard.emplace(device.type(), *autocast_dtype);
      }
      loss = torch::nn::functional::cross_entropy(model->forward(b.input()), b.target()).to(torch::kFloat32);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    if (s >= steps - 50) {
      loss_sum += loss.item<double>();
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.final_loss = loss_sum / static_cast<double>(std::min<int64_t>(50, steps));
  if (test == nullptr) {
    return r;
  }
  model->eval();
  torch::NoGradGuard no_grad;
  int64_t correct = 0;
  for (int64_t i = 0; i < test->images.size(0); i += 1000) {
    const int64_t n = std::min<int64_t>(1000, test->images.size(0) - i);
    std::optional<trainkit::amp::Autocast> guard;
    if (autocast_dtype) {
      guard.emplace(device.type(), *autocast_dtype);
    }
    const at::Tensor pred = model->forward(test->images.narrow(0, i, n).to(device)).argmax(1);
    correct += pred.eq(test->labels.narrow(0, i, n).to(device)).sum().item<int64_t>();
  }
  r.test_accuracy = static_cast<double>(correct) / static_cast<double>(test->images.size(0));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"Mixed precision: bf16 autocast vs float32 on the CPU (fp16 + GradScaler on CUDA), and a "
                         "GradScaler trajectory with an injected overflow"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t steps = 300;
  std::string device_name = "cpu";
  int64_t limit_test = 0;
  std::vector<std::string> dtypes;
  cli.option("--data-dir", data_dir, "Fashion-MNIST directory").show_default();
  cli.option("--steps", steps, "Training steps per run (batch 128)").show_default().positive();
  cli.option("--device", device_name, "cpu or cuda").one_of({"cpu", "cuda"}).show_default();
  cli.option("--limit-test", limit_test, "Evaluate on the first N test images (0 = all 10,000)").show_default()
      .non_negative();
  cli.option("--dtypes", dtypes,
             "Autocast dtypes compared with float32, each a run of its own; float16 adds a GradScaler "
             "(default: bfloat16 on the CPU, float16 on CUDA)")
      .one_of({"bfloat16", "float16"});
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");

  return trainkit::app::run_main([&] {
    if (device_name == "cuda" && !torch::cuda::is_available()) {
      std::fprintf(stderr, "amp: --device cuda but no CUDA device is available\n");
      return 2;
    }
    const torch::Device device(device_name == "cuda" ? torch::kCUDA : torch::kCPU);
    const auto train = trainkit::data::load_mnist_split(data_dir, true);
    const auto test = trainkit::data::load_mnist_split(data_dir, false, limit_test);
    if (dtypes.empty()) {
      dtypes = {device.is_cuda() ? "float16" : "bfloat16"};
    }
    fmt::print("Fashion-MNIST CNN, Adam 1e-3, batch 128, {} steps on {} ({} threads)\n", steps, device.str(),
               torch::get_num_threads());
    fmt::print("{:<34} {:>10} {:>12} {:>14}\n", "precision", "seconds", "loss (last 50)", "test accuracy");
    const auto dtype_of = [](const std::string& name) { return name == "float16" ? torch::kFloat16 : torch::kBFloat16; };
    // Warm-up runs first, so that no measurement pays for creating the kernels' primitives.
    run(train, nullptr, device, std::nullopt, false, 10);
    for (const auto& name : dtypes) {
      run(train, nullptr, device, dtype_of(name), name == "float16", 10);
    }
    const RunResult f32 = run(train, &test, device, std::nullopt, false, steps);
    fmt::print("{:<34} {:>10.2f} {:>12.4f} {:>14.4f}\n", "float32", f32.seconds, f32.final_loss, f32.test_accuracy);
    std::vector<std::pair<std::string, double>> ratios;
    for (const auto& name : dtypes) {
      const bool fp16 = name == "float16";
      const RunResult mixed = run(train, &test, device, dtype_of(name), fp16, steps);
      fmt::print("{:<34} {:>10.2f} {:>12.4f} {:>14.4f}\n", name + (fp16 ? " autocast + GradScaler" : " autocast"),
                 mixed.seconds, mixed.final_loss, mixed.test_accuracy);
      ratios.emplace_back(name, mixed.seconds / f32.seconds);
    }
    for (const auto& [name, ratio] : ratios) {
      fmt::print("time ratio {} / float32: {:.2f}\n", name, ratio);
    }
    fmt::print("\n");

    // A GradScaler trajectory: growth_interval 5, an overflow injected at steps 12 and 13.
    fmt::print("GradScaler(init_scale 1024, growth_interval 5): inf injected into one gradient at steps 12, 13\n");
    fmt::print("{:>5} {:>10} {:>8} {:>9}\n", "step", "scale", "tracker", "stepped");
    torch::manual_seed(0);
    auto model = torch::nn::Linear(4, 2);
    model->to(device);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    trainkit::amp::GradScaler scaler(device, trainkit::amp::GradScalerOptions().init_scale(1024).growth_interval(5));
    const at::Tensor x = torch::randn({8, 4}).to(device);
    for (int s = 1; s <= 16; ++s) {
      opt.zero_grad();
      scaler.scale(model->forward(x).pow(2).mean()).backward();
      if (s == 12 || s == 13) {
        model->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
      }
      const bool stepped = scaler.step(opt);
      scaler.update();
      fmt::print("{:>5} {:>10g} {:>8} {:>9}\n", s, scaler.get_scale(), scaler.get_growth_tracker(),
                 stepped ? "yes" : "SKIPPED");
    }
    return 0;
  });
}
