// adam_from_scratch: trains the same model twice from the same initial weights, data order and dropout
// masks — once with trainkit::optim::Adam (written from scratch, fused CPU kernel), once with LibTorch's
// torch::optim::Adam — and shows that the loss curves agree and what each optimizer step costs.
#include <algorithm>
#include <chrono>
#include <fstream>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/log/svg_plot.h"
#include "trainkit/optim/adam.h"
#include "trainkit/app/config.h"
#include "trainkit/app/main.h"
#include "trainkit/app/run.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Run {
  std::string name;
  trainkit::app::Run setup;  // only its data, model and optimizer: this app runs its own loop
  std::vector<double> loss;
  std::vector<double> step_ms;  // optimizer.step() only
};

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "trainkit's Adam (from scratch, fused) vs torch::optim::Adam: same model, same data, same curves?"};
  std::string config_path = "configs/adam_from_scratch.toml";
  int64_t steps = 200;
  int64_t every = 20;
  std::string out_prefix;
  cli.option("--config", config_path, "Training config (data, model, optimizer lr/betas/eps, batch size, seed)")
      .show_default();
  cli.option("--steps", steps, "Training steps of each run").show_default().positive();
  cli.option("--every", every, "Print the losses every N steps").show_default().positive();
  cli.option("--out", out_prefix, "Write PREFIX.csv and PREFIX.svg (both loss curves)");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");

  return trainkit::app::run_main([&] {
    const auto config = trainkit::app::load_config(config_path);
    if (config.optimizer.name != "adam") {
      throw trainkit::app::ConfigError(
          fmt::format("{}: optimizer.name must be \"adam\" for this comparison (got \"{}\")", config_path,
                      config.optimizer.name));
    }
    // Both setups are built with the config's seed: identical initial weights and data order.
    Run ours{"trainkit::optim::Adam", trainkit::app::build_run(config, config_path), {}, {}};
    Run theirs{"torch::optim::Adam", trainkit::app::build_run(config, config_path), {}, {}};
    const auto& o = static_cast<const trainkit::optim::AdamOptions&>(*config.optimizer.options);
    theirs.setup.trainer.reset();  // it refers to the optimizer replaced next
    theirs.setup.optimizer = std::make_unique<torch::optim::Adam>(
        theirs.setup.model->parameters(), torch::optim::AdamOptions(o.lr())
                                              .betas(o.betas())
                                              .eps(o.eps())
                                              .weight_decay(o.weight_decay())
                                              .amsgrad(o.amsgrad()));
    fmt::print("{} steps, batch {}, lr {}, {} threads; optimizer.step() of the model's {} parameters\n", steps,
               config.train.batch_size, o.lr(), torch::get_num_threads(),
               [&] {
                 int64_t n = 0;
                 for (const auto& p : ours.setup.model->parameters()) {
                   n += p.numel();
                 }
                 return n;
               }());
    fmt::print("{:>6} {:>14} {:>14} {:>12}\n", "step", "loss trainkit", "loss torch", "|difference|");
    auto& loader = *ours.setup.train;
    int64_t epoch = 0;
    loader.set_epoch(epoch);
    double max_diff = 0;
    for (int64_t step = 1; step <= steps; ++step) {
      std::optional<trainkit::data::Batch> next = loader.next();
      if (!next) {
        loader.set_epoch(++epoch);
        next = loader.next();
      }
      const trainkit::data::Batch batch = std::move(*next);
      for (Run* run : {&ours, &theirs}) {
        torch::manual_seed(static_cast<uint64_t>(config.train.seed) * 1000003 + static_cast<uint64_t>(step));  // same dropout masks
        run->setup.model->train();
        run->setup.optimizer->zero_grad();
        const auto loss = torch::nn::functional::cross_entropy(run->setup.forward(batch), batch.target());
        loss.backward();
        const auto start = Clock::now();
        run->setup.optimizer->step();
        run->step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        run->loss.push_back(loss.item<double>());
      }
      const double diff = std::abs(ours.loss.back() - theirs.loss.back());
      max_diff = std::max(max_diff, diff);
      if (step % every == 0 || step == 1) {
        fmt::print("{:>6} {:>14.6f} {:>14.6f} {:>12.2e}\n", step, ours.loss.back(), theirs.loss.back(), diff);
      }
    }
    double max_param = 0;
    const auto a = ours.setup.model->parameters();
    const auto b = theirs.setup.model->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      max_param = std::max(max_param, (a[i] - b[i]).abs().max().item<double>());
    }
    const double ms_ours = median(ours.step_ms);
    const double ms_theirs = median(theirs.step_ms);
    fmt::print("\nlargest loss difference over {} steps: {:.2e}; largest parameter difference at the end: {:.2e}\n",
               steps, max_diff, max_param);
    fmt::print("optimizer.step(), median: trainkit {:.3f} ms, torch::optim::Adam {:.3f} ms ({:.2f}x faster)\n",
               ms_ours, ms_theirs, ms_theirs / ms_ours);
    if (!out_prefix.empty()) {
      std::ofstream csv(out_prefix + ".csv");
      csv << "step,loss_trainkit,loss_torch,step_ms_trainkit,step_ms_torch\n";
      std::vector<double> x;
      for (size_t i = 0; i < ours.loss.size(); ++i) {
        csv << fmt::format("{},{},{},{},{}\n", i + 1, ours.loss[i], theirs.loss[i], ours.step_ms[i], theirs.step_ms[i]);
        x.push_back(static_cast<double>(i + 1));
      }
      trainkit::log::SvgPlot plot(trainkit::log::PlotOptions()
                                      .title("Fashion-MNIST CNN: trainkit::optim::Adam vs torch::optim::Adam")
                                      .x_label("step")
                                      .y_label("training loss"));
      plot.add_series({"trainkit::optim::Adam", x, ours.loss, false});
      plot.add_series({"torch::optim::Adam", x, theirs.loss, false});
      plot.save(out_prefix + ".svg");
      fmt::print("wrote {0}.csv and {0}.svg\n", out_prefix);
    }
    return 0;
  });
}
