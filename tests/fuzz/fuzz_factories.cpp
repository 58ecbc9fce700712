// Fuzz target `factories`: the optimizer and scheduler named by a configuration (fuzz_config.h) are
// built over a small model's parameters and stepped for three short epochs, as `trainkit train` would.
// Any configuration the parser accepts must build and step without a crash, a hang or an exception other
// than ArgError (the factories' documented error for problems found only when building).

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "fuzz_config.h"
#include "fuzz_target.h"
#include "trainkit/app/config.h"
#include "trainkit/optim/factory.h"
#include "trainkit/sched/factory.h"

TRAINKIT_FUZZ_TARGET(factories) {
  const trainkit::fuzz::ConfigInput input = trainkit::fuzz::split_config_input(data, size);
  try {
    const trainkit::app::Config config = trainkit::app::parse_config(input.toml, "fuzz.toml", input.overrides);
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> params = {torch::linspace(-1.0, 1.0, 6).reshape({3, 2}), torch::full({2}, 0.5)};
    for (auto& p : params) {
      p.requires_grad_(true);
      p.mutable_grad() = torch::ones_like(p) * 0.1;
    }
    const auto optimizer = trainkit::optim::make_optimizer(config.optimizer, params);
    constexpr int64_t kEpochs = 3;
    constexpr int64_t kStepsPerEpoch = 4;
    std::optional<trainkit::sched::BuiltScheduler> built;
    if (config.scheduler) {
      built = trainkit::sched::make_scheduler(*config.scheduler, *optimizer, {kEpochs, kStepsPerEpoch});
    }
    auto step_scheduler = [&](int64_t epoch) {
      if (built->scheduler->takes_metric()) {
        built->scheduler->step(1.0 / static_cast<double>(epoch + 1));
      } else {
        built->scheduler->step();
      }
    };
    for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
      for (int64_t step = 0; step < kStepsPerEpoch; ++step) {
        optimizer->step();
        if (built && built->interval == "step") {
          step_scheduler(epoch);
        }
      }
      if (built && built->interval == "epoch") {
        step_scheduler(epoch);
      }
    }
    for (const auto& group : optimizer->param_groups()) {
      trainkit::fuzz::check(!std::isnan(group.options().get_lr()), "the scheduler set a NaN learning rate");
    }
  } catch (const trainkit::ArgError&) {
  }
  return 0;
}
