// schedule: builds an LR scheduler from a TOML file whose keys are PyTorch's argument names, steps it,
// and prints/writes the LR (and cycled momentum) of every step as CSV and as an SVG line plot.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/log/svg_plot.h"
#include "trainkit/sched/cyclic.h"
#include "trainkit/app/cli.h"
#include "trainkit/app/main.h"
#include "trainkit/app/toml_args.h"
#include "trainkit/sched/factory.h"

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error(path + ": cannot read");
  }
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"Trace an LR schedule from a TOML config (type = \"CosineAnnealingLR\", T_max = 100, ...)"};
  std::string config;
  int64_t steps = 0;
  std::string csv_path;
  std::string svg_path;
  std::string optimizer = "sgd";
  double lr = 0.1;
  int groups = 1;
  bool quiet = false;
  cli.option("--config", config, "Scheduler config, e.g. configs/schedules/cosine.toml").required();
  cli.option("--steps", steps, "Number of scheduler steps to trace").required().positive();
  cli.option("--csv", csv_path, "Write step,group,lr,momentum here (default: print to stdout)");
  cli.option("--svg", svg_path, "Draw the LR curve (and momentum, when cycled) here");
  cli.option("--optimizer", optimizer, "sgd (momentum 0.9) or adam: the optimizer driven").one_of({"sgd", "adam"})
      .show_default();
  cli.option("--lr", lr, "Base LR of the first param group").show_default();
  cli.option("--groups", groups, "Param groups (group g has base LR lr / 10^g)").range(1, 4).show_default();
  cli.flag("--quiet", quiet, "Do not print the CSV to stdout when --csv is not given");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");

  return trainkit::app::run_main([&] {
    // The table is read and checked before anything is built.
    const auto spec = trainkit::sched::parse_scheduler(trainkit::app::parse_toml(read_text(config), config), config);
    std::vector<torch::optim::OptimizerParamGroup> param_groups;
    for (int g = 0; g < groups; ++g) {
      const double group_lr = lr / std::pow(10.0, g);
      std::vector<at::Tensor> params{torch::zeros({1}, torch::requires_grad())};
      if (optimizer == "sgd") {
        param_groups.emplace_back(params, std::make_unique<torch::optim::SGDOptions>(
                                              torch::optim::SGDOptions(group_lr).momentum(0.9)));
      } else {
        param_groups.emplace_back(params,
                                  std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(group_lr)));
      }
    }
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (optimizer == "sgd") {
      opt = std::make_unique<torch::optim::SGD>(param_groups, torch::optim::SGDOptions(lr).momentum(0.9));
    } else {
      opt = std::make_unique<torch::optim::Adam>(param_groups, torch::optim::AdamOptions(lr));
    }
    const auto built = trainkit::sched::make_scheduler(spec, *opt, trainkit::sched::SchedulerContext{1, steps});
    auto& scheduler = *built.scheduler;

    // ReduceLROnPlateau needs a metric: a synthetic validation loss that improves, then plateaus, with noise.
    std::mt19937 rng(0);
    std::normal_distribution<double> noise(0.0, 0.01);
    const auto metric = [&](int64_t s) {
      return 0.3 + 0.7 * std::exp(-static_cast<double>(s) / (0.1 * static_cast<double>(steps))) + noise(rng);
    };

    std::vector<std::vector<double>> lrs(static_cast<size_t>(groups));
    std::vector<std::vector<double>> momenta(static_cast<size_t>(groups));
    std::vector<double> xs;
    for (int64_t s = 0; s <= steps; ++s) {
      if (s > 0) {
        if (scheduler.takes_metric()) {
          scheduler.step(metric(s));
        } else {
          scheduler.step();
        }
      }
      xs.push_back(static_cast<double>(s));
      for (size_t g = 0; g < static_cast<size_t>(groups); ++g) {
        lrs[g].push_back(opt->param_groups()[g].options().get_lr());
        momenta[g].push_back(trainkit::sched::get_cyclable_momentum(opt->param_groups()[g]));
      }
    }

    std::string csv = "step,group,lr,momentum\n";
    for (size_t s = 0; s < xs.size(); ++s) {
      for (size_t g = 0; g < lrs.size(); ++g) {
        csv += fmt::format("{},{},{:.12g},{:.12g}\n", s, g, lrs[g][s], momenta[g][s]);
      }
    }
    if (!csv_path.empty()) {
      std::ofstream(csv_path) << csv;
    } else if (!quiet) {
      std::fputs(csv.c_str(), stdout);
    }
    if (!svg_path.empty()) {
      const auto po = trainkit::log::PlotOptions()
                          .title(fmt::format("{} ({})", scheduler.name(), config))
                          .x_label(built.interval == "step" ? "step" : "epoch")
                          .y_label("learning rate");
      trainkit::log::SvgPlot plot(po);
      for (size_t g = 0; g < lrs.size(); ++g) {
        plot.add_series({groups > 1 ? fmt::format("lr, group {}", g) : "lr", xs, lrs[g], false});
      }
      plot.save(svg_path);
      // A second picture for the cycled momentum, when the scheduler moves it.
      const auto [mn, mx] = std::minmax_element(momenta[0].begin(), momenta[0].end());
      if (*mx - *mn > 0) {
        auto mo = po;
        mo.y_label(optimizer == "adam" ? "beta1" : "momentum");
        trainkit::log::SvgPlot mplot(mo);
        mplot.add_series({mo.y_label(), xs, momenta[0], false});
        const std::string mpath = svg_path.substr(0, svg_path.rfind(".svg")) + "_momentum.svg";
        mplot.save(mpath);
      }
    }
    std::fprintf(stderr, "%s: %lld steps, lr %.6g -> %.6g (min %.6g, max %.6g)\n", scheduler.name().c_str(),
                 static_cast<long long>(steps), lrs[0].front(), lrs[0].back(),
                 *std::min_element(lrs[0].begin(), lrs[0].end()), *std::max_element(lrs[0].begin(), lrs[0].end()));
    return 0;
  });
}
