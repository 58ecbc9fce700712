// layerwise_lr: different learning rates per layer group — conv1 0.01, conv2 0.001, fc 0.0001 as in the
// notes — through param groups of one optimizer (the library's optim::lr_groups, by parameter name, as
// trainkit train's optimizer.lr_by_name), against the same model trained with one LR for all layers; prints
// every group's LR each epoch, and shows the one-line manual LR change of a param group.
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/optim/param_groups.h"
#include "trainkit/optim/sgd.h"
#include "trainkit/app/config.h"
#include "trainkit/app/main.h"
#include "trainkit/app/run.h"
#include "trainkit/train/trainer.h"

namespace {

/// The rules conv1, conv2, ... (each convolution with the norm after it) and fc (the linear layers), as
/// patterns "<child>.*" on the model's parameter names, each at its LR from `lrs` (one per rule) or at
/// `base` for all when `lrs` is empty.
std::vector<trainkit::optim::LrRule> layer_rules(const torch::nn::Module& model, const std::vector<double>& lrs,
                                                 double base) {
  std::vector<trainkit::optim::LrRule> rules;
  trainkit::optim::LrRule fc{"fc", {}, base};
  for (const auto& child : model.named_children()) {
    if (child.value()->parameters().empty()) {
      continue;
    }
    const std::string pattern = child.key() + ".*";
    if (child.value()->as<torch::nn::Conv2d>() != nullptr) {
      rules.push_back({fmt::format("conv{}", rules.size() + 1), {pattern}, base});
    } else if (child.value()->as<torch::nn::Linear>() != nullptr) {
      fc.patterns.push_back(pattern);
    } else if (!rules.empty()) {
      rules.back().patterns.push_back(pattern);  // a batch norm joins its convolution
    }
  }
  rules.push_back(fc);
  if (!lrs.empty() && lrs.size() != rules.size()) {
    throw trainkit::app::ConfigError(
        fmt::format("--lrs: the model has {} layer groups, got {} learning rates", rules.size(), lrs.size()));
  }
  for (size_t i = 0; i < lrs.size(); ++i) {
    rules[i].lr = lrs[i];
  }
  return rules;
}

/// Prints the epoch's result and every group's LR; applies the manual LR change after `decay_epoch`.
struct Report : trainkit::train::Callback {
  std::vector<std::string> names;
  int64_t decay_epoch = 0;
  double decay = 0.1;
  std::vector<double> val_acc;
  bool on_epoch_end(trainkit::train::Trainer& trainer, const trainkit::train::EpochEvent& e) override {
    auto& groups = trainer.optimizer().param_groups();
    std::string lrs;
    for (size_t i = 0; i < groups.size(); ++i) {
      lrs += fmt::format("  {} {:g}", names[i], groups[i].options().get_lr());
    }
    val_acc.push_back(e.val ? e.val->metric("accuracy") : 0.0);
    fmt::print("  epoch {}: train loss {:.4f}, val acc {:.4f};  LR{}\n", e.epoch + 1, e.train_loss, val_acc.back(), lrs);
    if (e.epoch + 1 == decay_epoch) {
      // The manual adjustment: one line per group, as with torch.optim in Python (g['lr'] *= 0.1).
      for (auto& g : groups) {
        g.options().set_lr(g.options().get_lr() * decay);
      }
      fmt::print("  manual change after epoch {}: every group's LR x {:g}\n", e.epoch + 1, decay);
    }
    return false;
  }
};

double train(const trainkit::app::Config& config, const std::string& source, const std::vector<double>& lrs,
             int64_t decay_epoch) {
  // Same seed: same weights and data order. The run's data and model are used; the optimizer with one
  // param group per layer is built here, which is what this demo shows.
  trainkit::app::Run setup = trainkit::app::build_run(config, source);
  const auto& o = static_cast<const trainkit::optim::SgdOptions&>(*config.optimizer.options);
  const auto base = trainkit::optim::SgdOptions(o.lr()).momentum(o.momentum()).weight_decay(o.weight_decay());
  // The library's groups by parameter name (trainkit train's optimizer.lr_by_name): the notes' param groups.
  const auto rules = layer_rules(*setup.model, lrs, o.lr());
  const auto groups = trainkit::optim::lr_groups(setup.model->named_parameters(), rules,
                                                 trainkit::optim::LrGroupsOptions().weight_decay(o.weight_decay()));
  auto report = std::make_shared<Report>();
  for (const auto& g : groups) {
    report->names.push_back(g.name);
  }
  if (!lrs.empty()) {
    fmt::print("  the same groups in a trainkit train config, under [optimizer]:\n    lr_by_name = [\n");
    for (const auto& rule : rules) {
      fmt::print("      {{ name = \"{}\", pattern = [\"{}\"], lr = {:g} }},\n", rule.name,
                 fmt::join(rule.patterns, "\", \""), rule.lr);
    }
    fmt::print("    ]\n");
  }
  auto param_groups = trainkit::optim::to_param_groups(groups, base);
  trainkit::optim::Sgd optimizer(param_groups, base);
  report->decay_epoch = decay_epoch;
  trainkit::train::Trainer trainer(setup.model, setup.forward, optimizer,
                                   trainkit::train::TrainerOptions().epochs(config.trainer.epochs()));
  trainer.add_callback(report);
  trainer.fit(*setup.train, setup.val.get());
  return trainer.evaluate(*setup.test).metric("accuracy");
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "Layer-wise learning rates through param groups (conv1 / conv2 / fc), vs one LR for all layers"};
  std::string config_path = "configs/layerwise_lr.toml";
  std::vector<std::string> overrides;
  std::vector<double> lrs{0.01, 0.001, 0.0001};
  int64_t decay_epoch = 2;
  cli.option("--config", config_path, "Training config; optimizer.lr is the single-LR baseline").show_default();
  cli.option("--set", overrides, "Override a config key: section.key=value (repeatable)");
  cli.option("--lrs", lrs, "Learning rate per layer group: conv1 conv2 ... fc").show_default().delimiter(',');
  cli.option("--decay-epoch", decay_epoch, "Multiply every group's LR by 0.1 after this epoch (0 = never)")
      .show_default();
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");
  return trainkit::app::run_main([&] {
    const auto config = trainkit::app::load_config(config_path, overrides);
    if (config.optimizer.name != "sgd") {
      throw trainkit::app::ConfigError(fmt::format("{}: optimizer.name must be \"sgd\" (got \"{}\")", config_path,
                                                     config.optimizer.name));
    }
    fmt::print("layer-wise LRs (trainkit::optim::Sgd, momentum {}, {} epochs, batch {}):\n", static_cast<const trainkit::optim::SgdOptions&>(*config.optimizer.options).momentum(),
               config.trainer.epochs(), config.train.batch_size);
    const double layerwise = train(config, config_path, lrs, decay_epoch);
    fmt::print("one LR {:g} for every layer:\n", config.optimizer.options->get_lr());
    const double uniform = train(config, config_path, {}, decay_epoch);
    fmt::print("test accuracy: layer-wise {:.4f}, single LR {:.4f}\n", layerwise, uniform);
    return 0;
  });
}
