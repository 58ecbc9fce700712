// A program as a LibTorch user writes one: the model, the optimizer, a per-step OneCycleLR over it and a
// SummaryWriter are held by globals, so they are destroyed after main() returns, in static destruction order
// (after the function-local statics that trainkit touched first). Run by the ctest sched_globals_at_exit,
// which expects exit code 0 and the last line below: nothing trainkit destroys then may use memory that
// static destruction has already freed (a scheduler once looked up its initial_lr registry there and
// corrupted the heap). Usage: scheduler_globals_at_exit LOG_DIR
#include <cstdio>
#include <memory>

#include <torch/torch.h>
#include <trainkit/log.h>
#include <trainkit/optim.h>
#include <trainkit/sched.h>

namespace {
std::shared_ptr<torch::nn::LinearImpl> g_model;
std::shared_ptr<trainkit::optim::AdamW> g_optimizer;
std::shared_ptr<trainkit::sched::OneCycleLR> g_schedule;
std::shared_ptr<trainkit::log::SummaryWriter> g_writer;
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s LOG_DIR\n", argv[0]);
    return 2;
  }
  torch::manual_seed(0);
  g_model = std::make_shared<torch::nn::LinearImpl>(8, 1);
  g_optimizer = std::make_shared<trainkit::optim::AdamW>(g_model->parameters(), trainkit::optim::AdamWOptions(1e-2));
  const int64_t steps = 20;
  g_schedule = std::make_shared<trainkit::sched::OneCycleLR>(
      *g_optimizer, trainkit::sched::OneCycleLROptions({0.05}).total_steps(steps));
  g_writer = std::make_shared<trainkit::log::SummaryWriter>(argv[1]);
  const auto x = torch::randn({64, 8});
  const auto y = x.sum(1, true);
  double loss = 0;
  for (int64_t step = 0; step < steps; ++step) {
    g_optimizer->zero_grad();
    auto l = torch::mse_loss(g_model->forward(x), y);
    l.backward();
    g_optimizer->step();
    g_schedule->step();
    loss = l.item<double>();
    g_writer->add_scalar("train/loss", loss, step);
  }
  std::printf("scheduler_globals_at_exit: %lld steps, last loss %.4f, globals left to static destruction\n",
              static_cast<long long>(steps), loss);
  std::fflush(stdout);
  return 0;
}
