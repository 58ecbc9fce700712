// grad_accum: batch 32 × 4 accumulated micro-batches vs batch 128 on Fashion-MNIST, from the same
// initial weights and the same data order. Shows the parameters agree after the first optimizer step
// and that the two training curves match.
#include <cstdio>

#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/main.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/grad/accumulation.h"
#include "trainkit/nn/models.h"

namespace {

double max_param_diff(torch::nn::Sequential& a, torch::nn::Sequential& b) {
  double m = 0;
  const auto pa = a->parameters();
  const auto pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    m = std::max(m, (pa[i] - pb[i]).abs().max().item<double>());
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"Gradient accumulation: batch 32 x 4 micro-batches vs batch 128, same start, same data order"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t micro = 32;
  int64_t accumulation = 4;
  int64_t steps = 200;
  int64_t report_every = 20;
  double max_diff = -1;
  cli.option("--data-dir", data_dir, "Fashion-MNIST directory").show_default();
  cli.option("--micro-batch", micro, "Micro-batch size").show_default().positive();
  cli.option("--accumulation-steps", accumulation, "Micro-batches per step").show_default().positive();
  cli.option("--steps", steps, "Optimizer steps").show_default().positive();
  cli.option("--report-every", report_every, "Print every N steps").show_default().positive();
  cli.option("--max-diff", max_diff,
             "Exit with 1 when the final max |param diff| between the two runs exceeds this (off when < 0)");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");

  return trainkit::app::run_main([&] {
    // float64 so that the comparison shows the method's exactness rather than float32 summation order.
    auto train = trainkit::data::load_mnist_split(data_dir, true, steps * micro * accumulation);
    const at::Tensor x = train.images.to(torch::kFloat64);
    const at::Tensor y = train.labels;
    const int64_t big = micro * accumulation;
    trainkit::data::TensorLoader big_loader(x, y, trainkit::data::TensorLoaderOptions().batch_size(big).seed(0));

    const auto make = [] {
      torch::manual_seed(0);
      // No batch norm (its statistics depend on the batch size) and no dropout (random per forward): with
      // them the two runs would differ by design, not by the accumulation.
      auto m = trainkit::nn::make_cnn(
          trainkit::nn::CnnOptions().channels({16, 32}).hidden(64).dropout(0).batch_norm(false));
      m->to(torch::kFloat64);
      return m;
    };
    auto model_big = make();
    auto model_acc = make();
    torch::optim::SGD opt_big(model_big->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::SGD opt_acc(model_acc->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    trainkit::grad::GradAccumulation acc(accumulation);

    std::printf("%6s %14s %14s %16s\n", "step", "loss (128)", "loss (32x4)", "max |param diff|");
    const int64_t n_steps = std::min(steps, big_loader.num_batches());
    for (int64_t s = 0; s < n_steps; ++s) {
      const auto b = big_loader.batch(s);
      opt_big.zero_grad();
      const at::Tensor loss_big = torch::nn::functional::cross_entropy(model_big->forward(b.input()), b.target());
      loss_big.backward();
      opt_big.step();

      opt_acc.zero_grad();
      double loss_acc = 0;
      for (int64_t k = 0; k < accumulation; ++k) {
        const at::Tensor xi = b.input().narrow(0, k * micro, micro);
        const at::Tensor yi = b.target().narrow(0, k * micro, micro);
        const at::Tensor loss = torch::nn::functional::cross_entropy(model_acc->forward(xi), yi);
        (loss * acc.loss_scale()).backward();
        loss_acc += loss.item<double>() * acc.loss_scale();
        if (acc.sync_now()) {
          opt_acc.step();
        }
        acc.next();
      }
      if (s == 0 || (s + 1) % report_every == 0) {
        std::printf("%6lld %14.6f %14.6f %16.3e\n", static_cast<long long>(s + 1), loss_big.item<double>(), loss_acc,
                    max_param_diff(model_big, model_acc));
      }
    }
    const double final_diff = max_param_diff(model_big, model_acc);
    std::printf("final max |param diff| after %lld steps: %.3e\n", static_cast<long long>(n_steps), final_diff);
    if (max_diff >= 0 && !(final_diff <= max_diff)) {
      std::fprintf(stderr, "grad_accum: the accumulated run departs from the big-batch run by %.3e > --max-diff %.3e\n",
                   final_diff, max_diff);
      return 1;
    }
    return 0;
  });
}
