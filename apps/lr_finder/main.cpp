// lr_finder: the LR range test (Smith 2017) on a training config's model, optimizer and data, as
// `trainkit lr-find` runs it (app::run_lr_find_job): prints the curve and the suggestions, writes
// lr_find.csv and lr_find.svg, and the command that trains with the valley suggestion. The config's [amp]
// applies: e.g. --set amp.enabled=true --set amp.grad_scaler=true runs the test under bfloat16 autocast
// with a GradScaler, and the steps it skips are marked.
#include <algorithm>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/config.h"
#include "trainkit/app/jobs.h"
#include "trainkit/app/main.h"

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"LR range test on a Fashion-MNIST training config: curve, suggestions, CSV and SVG"};
  trainkit::app::LrFindJobOptions options;
  std::string config_path = "configs/fashion_mnist.toml";
  std::vector<std::string> overrides;
  options.out_dir = "lr_finder";
  double start_lr = options.finder.start_lr();
  double end_lr = options.finder.end_lr();
  int64_t num_iter = options.finder.num_iter();
  std::string step_mode = options.finder.step_mode();
  int64_t rows = 12;
  cli.option("--config", config_path, "Training config (model, optimizer, data)").show_default();
  cli.option("--set", overrides, "Override one key: section.key=value (repeatable)");
  cli.option("--out", options.out_dir, "Directory for lr_find.csv and lr_find.svg").show_default();
  cli.option("--start-lr", start_lr, "First LR").show_default().positive();
  cli.option("--end-lr", end_lr, "Last LR").show_default().positive();
  cli.option("--num-iter", num_iter, "Steps of the test").show_default().range(2, 1000000);
  cli.option("--step-mode", step_mode, "exp or linear").show_default().one_of({"exp", "linear"});
  cli.flag("--val", options.use_val, "Record the validation loss instead of the training loss");
  cli.option("--rows", rows, "Rows of the printed curve").show_default().range(2, 1000);
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");
  options.finder.start_lr(start_lr).end_lr(end_lr).num_iter(num_iter).step_mode(step_mode);

  return trainkit::app::run_main([&] {
    const auto config = trainkit::app::load_config(config_path, overrides);
    const auto result = trainkit::app::run_lr_find_job(config, config_path, options);
    const auto& c = result.curve;
    fmt::print("\n{:>12} {:>10} {:>14}\n", "lr", "loss", "smoothed loss");
    const size_t n = c.lrs.size();
    const size_t stride = std::max<size_t>(1, n / static_cast<size_t>(rows));
    for (size_t i = 0; i < n; i += stride) {
      fmt::print("{:>12.3e} {:>10.4f} {:>14.4f}{}\n", c.lrs[i], c.losses[i], c.smoothed_losses[i],
                 c.skipped[i] ? "  (step skipped by the GradScaler)" : "");
    }
    fmt::print("{} steps{}{}\n\n", n,
               c.skipped_steps() > 0 ? fmt::format(", {} skipped by the GradScaler", c.skipped_steps()) : "",
               c.diverged ? fmt::format(", stopped at lr {:.3g}: the loss diverged", c.lrs.back()) : "");
    for (const auto& s : result.suggestions) {
      fmt::print("suggested lr ({:>10}): {:.3g}\n", s.method, s.lr);
    }
    for (const auto& s : result.suggestions) {
      if (s.method == "valley") {
        fmt::print("\ntrain with it:  trainkit train --config {} --set optimizer.lr={:.3g}\n", config_path, s.lr);
        if (config.scheduler) {
          fmt::print("(this config has a [scheduler], whose own LR settings drive the LR during training)\n");
        }
      }
    }
    fmt::print("wrote {0}/lr_find.csv and {0}/lr_find.svg\n", options.out_dir);
    return 0;
  });
}
