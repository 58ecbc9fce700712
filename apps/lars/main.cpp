// lars: large-batch Fashion-MNIST training (batch 4096 by default) with LARS against plain SGD with momentum
// at the same settings — learning rate, momentum, weight decay, param groups and LR schedule — from the same
// initial weights and data order, reporting loss and validation accuracy per epoch and the test accuracy.
#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/config.h"
#include "trainkit/app/main.h"
#include "trainkit/app/run.h"
#include "trainkit/optim/lars.h"
#include "trainkit/train/trainer.h"

namespace {

/// Remembers the loss and validation accuracy of every epoch.
struct EpochLog : trainkit::train::Callback {
  std::vector<double> loss, val_acc;
  bool on_epoch_end(trainkit::train::Trainer&, const trainkit::train::EpochEvent& e) override {
    loss.push_back(e.train_loss);
    val_acc.push_back(e.val ? e.val->metric("accuracy") : 0.0);
    return false;
  }
};

struct Result {
  std::shared_ptr<EpochLog> log = std::make_shared<EpochLog>();
  double test_acc = 0;
};

Result train(const trainkit::app::Config& config, const std::string& source) {
  trainkit::app::Run run = trainkit::app::build_run(config, source);
  Result r;
  run.trainer->add_callback(r.log);
  run.trainer->fit(*run.train, run.val.get());
  r.test_acc = run.trainer->evaluate(*run.test).metric("accuracy");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"Large-batch training: LARS vs SGD with momentum at the same settings (Fashion-MNIST CNN)"};
  std::string config_path = "configs/lars.toml";
  std::vector<std::string> overrides;
  cli.option("--config", config_path, "Training config with an [optimizer] of name \"lars\"").show_default();
  cli.option("--set", overrides, "Override a config key: section.key=value (repeatable)");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");
  return trainkit::app::run_main([&] {
    const auto lars = trainkit::app::load_config(config_path, overrides);
    if (lars.optimizer.name != "lars") {
      throw trainkit::app::ConfigError(fmt::format("{}: optimizer.name must be \"lars\" (got \"{}\")", config_path,
                                                     lars.optimizer.name));
    }
    // SGD with the same lr, momentum, dampening, nesterov, weight_decay, groups and schedule: LARS's values
    // of the arguments SGD has, read by the optimizer registry.
    auto sgd = lars;
    trainkit::ArgTable shared;
    for (const auto& [key, value] : trainkit::optim::optimizer_args(lars.optimizer)) {
      if (key == "lr" || key == "momentum" || key == "dampening" || key == "nesterov" || key == "weight_decay" ||
          key == "no_decay_1d") {
        shared.emplace_back(key, value);
      }
    }
    trainkit::ArgReader sgd_args(shared, config_path + " (LARS's arguments for SGD)");
    sgd.optimizer = trainkit::optim::parse_optimizer("sgd", sgd_args);
    const auto& o = static_cast<const trainkit::optim::LarsOptions&>(*lars.optimizer.options);
    fmt::print("batch {}, {} epochs, lr {}, momentum {}, weight_decay {}, trust_coefficient {}, no_decay_1d {}{}\n",
               lars.train.batch_size, lars.trainer.epochs(), o.lr(), o.momentum(), o.weight_decay(), o.trust_coefficient(),
               lars.optimizer.no_decay_1d, lars.scheduler ? ", with the config's [scheduler]" : "");
    fmt::print("training with LARS ...\n");
    const Result a = train(lars, config_path);
    fmt::print("training with SGD + momentum ...\n");
    const Result b = train(sgd, config_path);
    fmt::print("\n{:>5} {:>12} {:>12} {:>12} {:>12}\n", "epoch", "LARS loss", "LARS val", "SGD loss", "SGD val");
    for (size_t e = 0; e < a.log->loss.size(); ++e) {
      const auto cell = [](const std::vector<double>& v, size_t i, const char* f) {
        return i < v.size() ? fmt::format(fmt::runtime(f), v[i]) : std::string("-");
      };
      fmt::print("{:>5} {:>12} {:>12} {:>12} {:>12}\n", e + 1, cell(a.log->loss, e, "{:.4f}"),
                 cell(a.log->val_acc, e, "{:.4f}"), cell(b.log->loss, e, "{:.4f}"), cell(b.log->val_acc, e, "{:.4f}"));
    }
    fmt::print("test accuracy: LARS {:.4f}, SGD {:.4f}\n", a.test_acc, b.test_acc);
    return 0;
  });
}
