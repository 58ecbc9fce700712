// lars: large-batch Fashion-MNIST training (batch 4096 by default) with LARS against plain SGD with momentum
// at the same settings — learning rate, momentum, weight decay, param groups and LR schedule — from the same
// initial weights and data order, reporting loss and validation accuracy per epoch and the test accuracy.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/sched/factory.h"
#include "trainkit/train/config.h"
#include "trainkit/train/job.h"
#include "trainkit/train/trainer.h"

namespace {

/// Remembers the loss and validation accuracy of every epoch.
struct EpochLog : trainkit::train::Callback {
  std::vector<double> loss, val_acc;
  bool on_epoch_end(trainkit::train::Trainer&, const trainkit::train::EpochEvent& e) override {
    loss.push_back(e.train_loss);
    val_acc.push_back(e.val ? e.val->accuracy : 0.0);
    return false;
  }
};

struct Result {
  std::shared_ptr<EpochLog> log = std::make_shared<EpochLog>();
  double test_acc = 0;
};

Result train(const trainkit::train::TrainConfig& config, const std::string& source) {
  auto setup = trainkit::train::build_run_setup(config, source);
  trainkit::train::Trainer trainer(setup.model, *setup.optimizer,
                                   trainkit::train::TrainerOptions().epochs(config.train.epochs));
  if (!config.scheduler.empty()) {
    const auto built = trainkit::sched::make_scheduler(
        config.scheduler, *setup.optimizer, source + ": [scheduler]",
        trainkit::sched::SchedulerContext{config.train.epochs, setup.train->num_batches()});
    trainer.set_scheduler(built.scheduler, built.interval == "step");
  }
  Result r;
  trainer.add_callback(r.log);
  trainer.fit(*setup.train, setup.val.get());
  r.test_acc = trainer.evaluate(*setup.test).accuracy;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Large-batch training: LARS vs SGD with momentum at the same settings (Fashion-MNIST CNN)"};
  std::string config_path = "configs/lars.toml";
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "Training config with an [optimizer] of name \"lars\"")->capture_default_str();
  app.add_option("--set", overrides, "Override a config key: section.key=value (repeatable)");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto lars = trainkit::train::load_config(config_path, overrides);
    if (lars.optimizer.name != "lars") {
      throw trainkit::train::ConfigError(fmt::format("{}: optimizer.name must be \"lars\" (got \"{}\")", config_path,
                                                     lars.optimizer.name));
    }
    auto sgd = lars;
    sgd.optimizer.name = "sgd";  // same lr, momentum, dampening, nesterov, weight_decay, groups and schedule
    const auto& o = lars.optimizer;
    fmt::print("batch {}, {} epochs, lr {}, momentum {}, weight_decay {}, trust_coefficient {}, no_decay_1d {}{}\n",
               lars.train.batch_size, lars.train.epochs, *o.lr, *o.momentum, *o.weight_decay, *o.trust_coefficient,
               o.no_decay_1d, lars.scheduler.empty() ? "" : ", with the config's [scheduler]");
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
  } catch (const trainkit::train::ConfigError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
