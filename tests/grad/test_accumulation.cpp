// Gradient accumulation: K micro-batches accumulated equal one batch of K× the size (float64, 1e-10),
// with and without clipping, with a short last window.
#include <torch/torch.h>

#include "support.h"
#include "trainkit/grad/accumulation.h"
#include "trainkit/grad/clip.h"

using trainkit::grad::GradAccumulation;

namespace {

torch::nn::Sequential make_model() {
  torch::manual_seed(11);
  auto m = torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  m->to(torch::kFloat64);
  return m;
}

at::Tensor loss_of(torch::nn::Sequential& m, const at::Tensor& x, const at::Tensor& y) {
  return torch::nn::functional::cross_entropy(m->forward(x), y);
}

}  // namespace

TEST_CASE("GradAccumulation windows and scales", "[grad][accumulation]") {
  GradAccumulation acc(4, 10);  // windows of 4, 4, 2
  std::vector<double> scales;
  std::vector<bool> syncs;
  for (int i = 0; i < 12; ++i) {
    scales.push_back(acc.loss_scale());
    syncs.push_back(acc.sync_now());
    acc.next();
  }
  CHECK(scales == std::vector<double>{0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.5, 0.5, 0.25, 0.25});
  CHECK(syncs == std::vector<bool>{false, false, false, true, false, false, false, true, false, true, false, false});
  acc.seek(9);
  CHECK(acc.sync_now());
  CHECK(acc.window_size() == 2);
  CHECK_THROWS_AS(GradAccumulation(0), std::invalid_argument);
  CHECK_THROWS_AS(acc.seek(10), std::out_of_range);
  GradAccumulation open(3);  // unknown epoch length: every window full
  for (int i = 0; i < 7; ++i) {
    CHECK(open.loss_scale() == Approx(1.0 / 3));
    CHECK(open.sync_now() == (i % 3 == 2));
    open.next();
  }
}

TEST_CASE("K accumulated micro-batches equal one batch K times the size", "[grad][accumulation]") {
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({40, 6}, torch::kFloat64);
  const at::Tensor y = torch::randint(0, 3, {40}, torch::kInt64);
  const int64_t micro = 4;  // 10 micro-batches per epoch, windows of K = 4: 4, 4 and a short 2

  for (const bool clip : {false, true}) {
    DYNAMIC_SECTION((clip ? "with" : "without") << " clipping") {
      auto big = make_model();
      auto small = make_model();
      torch::optim::SGD big_opt(big->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
      torch::optim::SGD small_opt(small->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));

      // Reference: the windows as single batches of 16, 16 and 8.
      for (const auto& [start, len] : std::vector<std::pair<int64_t, int64_t>>{{0, 16}, {16, 16}, {32, 8}}) {
        big_opt.zero_grad();
        loss_of(big, x.narrow(0, start, len), y.narrow(0, start, len)).backward();
        if (clip) {
          trainkit::grad::clip_grad_norm_(big->parameters(), 0.05);
        }
        big_opt.step();
      }
      // Accumulated micro-batches of 4.
      GradAccumulation acc(4, 10);
      int steps = 0;
      small_opt.zero_grad();
      for (int64_t b = 0; b < 10; ++b) {
        (loss_of(small, x.narrow(0, b * micro, micro), y.narrow(0, b * micro, micro)) * acc.loss_scale()).backward();
        if (acc.sync_now()) {
          if (clip) {
            trainkit::grad::clip_grad_norm_(small->parameters(), 0.05);
          }
          small_opt.step();
          small_opt.zero_grad();
          ++steps;
        }
        acc.next();
      }
      CHECK(steps == 3);
      const auto pb = big->parameters();
      const auto ps = small->parameters();
      for (size_t i = 0; i < pb.size(); ++i) {
        INFO("parameter " << i);
        CHECK((pb[i] - ps[i]).abs().max().item<double>() < 1e-10);
      }
    }
  }
}
