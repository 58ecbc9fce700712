// monitoring: trains the Fashion-MNIST CNN with training and validation tracking through the Trainer and
// its callbacks, and writes everything a run is watched with: metrics.csv/metrics.jsonl, curves.svg, and
// TensorBoard events (loss/LR/throughput scalars, per-epoch validation, weight histograms, an image grid
// of inputs, and the run's hyperparameters with its final metrics in the HPARAMS tab).
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/config.h"
#include "trainkit/app/main.h"
#include "trainkit/app/providers.h"
#include "trainkit/app/run.h"
#include "trainkit/log/metrics.h"
#include "trainkit/log/summary_writer.h"
#include "trainkit/train/callbacks/metrics_logger.h"
#include "trainkit/train/trainer.h"

namespace {

namespace fs = std::filesystem;
using namespace trainkit;

/// Weight histograms at the start and after every epoch; keeps the epoch results for the summary table.
class WeightsCallback : public train::Callback {
 public:
  explicit WeightsCallback(std::shared_ptr<log::SummaryWriter> tb) : tb_(std::move(tb)) {}

  void on_train_begin(train::Trainer& trainer) override { histograms(trainer, trainer.state().step); }

  bool on_epoch_end(train::Trainer& trainer, const train::EpochEvent& event) override {
    histograms(trainer, event.step);
    epochs.push_back(event);
    return false;
  }

  std::vector<train::EpochEvent> epochs;

 private:
  void histograms(train::Trainer& trainer, int64_t step) {
    for (const auto& p : trainer.module().named_parameters()) {
      if (p.key().find("weight") == std::string::npos) {
        continue;
      }
      const at::Tensor w = p.value().detach().to(torch::kCPU, torch::kFloat32).contiguous();
      tb_->add_histogram("weights/" + p.key(), w.data_ptr<float>(), static_cast<size_t>(w.numel()), step);
    }
  }

  std::shared_ptr<log::SummaryWriter> tb_;
};

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "Fashion-MNIST CNN with train/validation tracking: metrics CSV, curves.svg and TensorBoard events"};
  std::string config_path = "configs/monitoring.toml";
  std::vector<std::string> overrides;
  std::string out_dir = "monitoring";
  int64_t epochs = 0;
  int64_t max_steps = -1;
  bool full = false;
  cli.option("--config", config_path, "Training config").show_default();
  cli.option("--set", overrides, "Override one key: section.key=value (repeatable)");
  cli.option("--out", out_dir, "Run directory (metrics, curves.svg, TensorBoard events)").show_default();
  cli.option("--epochs", epochs, "Epochs (default: the config's)").positive();
  cli.option("--max-steps", max_steps, "Stop after this many steps (0 = no limit; default: the config's)")
      .non_negative();
  cli.flag("--full", full,
           "The whole data set (55k train / 5k validation / 10k test) for 12 epochs, as configs/fashion_mnist.toml");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");

  return trainkit::app::run_main([&] {
    if (full) {
      overrides.insert(overrides.begin(), {"data.limit_train=0", "data.limit_test=0", "data.val_size=5000",
                                           "train.epochs=12"});
    }
    if (epochs > 0) {
      overrides.push_back(fmt::format("train.epochs={}", epochs));
    }
    if (max_steps >= 0) {
      overrides.push_back(fmt::format("train.max_steps={}", max_steps));
    }
    const app::Config config = app::load_config(config_path, overrides);
    if (config.data.val_size == 0) {
      throw app::ConfigError(config_path + ": monitoring tracks validation: data.val_size must be > 0");
    }
    // Every config section applies ([grad], [amp], [checkpoint] included); TensorBoard is always on here.
    app::Run run =
        app::build_run(config, config_path, app::RunOptions().dir(out_dir).tensorboard(true).progress("lines"));
    train::Trainer& trainer = *run.trainer;
    const auto& tb = run.tensorboard;
    const auto& metrics = run.metrics;
    const auto& logging = run.logging;
    // A grid of the first 16 validation images, rescaled from the normalized values to [0, 1].
    const at::Tensor grid =
        run.val_split.images.narrow(0, 0, std::min<int64_t>(16, run.val_split.images.size(0))).cpu().to(torch::kFloat);
    tb->add_image("inputs/validation", (grid - grid.min()) / (grid.max() - grid.min()), 0, "NCHW");
    auto weights = std::make_shared<WeightsCallback>(tb);
    trainer.add_callback(weights);

    spdlog::info("training the {} on {} train / {} validation / {} test images, {} epochs, batch {}, writing {}",
                 config.model.name, run.train_split.images.size(0), run.val_split.images.size(0),
                 run.test_split.images.size(0), config.trainer.epochs(),
                 config.train.batch_size, out_dir);
    trainer.fit(*run.train, run.val.get());
    const train::EvalResult test = trainer.evaluate(*run.test);

    log::MetricRow row;
    row.kind = "test";
    row.step = trainer.state().step;
    row.epoch = trainer.state().epoch;
    row.val_loss = test.loss;
    row.val_metrics = test.metrics.items();
    metrics->write(row);
    tb->add_scalar("test/accuracy", test.metric("accuracy"), trainer.state().step);
    tb->add_scalar("test/loss", test.loss, trainer.state().step);
    std::vector<std::pair<std::string, double>> final_metrics{{"hparam/test_accuracy", test.metric("accuracy")},
                                                              {"hparam/test_loss", test.loss}};
    if (!weights->epochs.empty() && weights->epochs.back().val) {
      final_metrics.emplace_back("hparam/val_accuracy", weights->epochs.back().val->metric("accuracy"));
    }
    const nn::CnnOptions cnn = app::read_extra(config, "model", app::ImageModelOptions::binding()).cnn();
    tb->add_hparams({{"optimizer", config.optimizer.name},
                     {"lr", config.optimizer.options->get_lr()},
                     {"batch_size", config.train.batch_size},
                     {"epochs", config.trainer.epochs()},
                     {"dropout", cnn.dropout()},
                     {"batch_norm", cnn.batch_norm()},
                     {"scheduler", run.scheduler ? run.scheduler->scheduler->name() : std::string("none")}},
                    final_metrics, "hparams", trainer.state().step);
    tb->close();
    log::write_curves_svg((fs::path(out_dir) / "metrics.csv").string(), (fs::path(out_dir) / "curves.svg").string(),
                          fmt::format("{}, {} epoch(s)", fs::path(config_path).stem().string(), config.trainer.epochs()));

    fmt::print("\n{:>5} {:>7} {:>11} {:>9} {:>8}\n", "epoch", "step", "train loss", "val loss", "val acc");
    for (const auto& e : weights->epochs) {
      fmt::print("{:>5} {:>7} {:>11.4f} {:>9.4f} {:>8.4f}\n", e.epoch + 1, e.step, e.train_loss,
                 e.val ? e.val->loss : 0.0, e.val ? e.val->metric("accuracy") : 0.0);
    }
    fmt::print("test: accuracy {:.4f}, loss {:.4f} after {} steps ({:.0f} train samples/s)\n", test.metric("accuracy"), test.loss,
               trainer.state().step,
               logging->train_seconds() > 0 ? static_cast<double>(logging->samples_trained()) / logging->train_seconds()
                                            : 0.0);
    fmt::print("wrote {0}/metrics.csv, {0}/metrics.jsonl, {0}/curves.svg, TensorBoard events in {0} "
               "(tensorboard --logdir {0})\n",
               out_dir);
    return 0;
  });
}
