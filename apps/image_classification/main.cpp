// image_classification: the LR notes' first case study. A CIFAR-style ResNet (He et al. 2016, section 4.2)
// trained with SGD + momentum + weight decay (none on biases and BatchNorm), random crop and horizontal
// flip, and ReduceLROnPlateau on the validation loss; Fashion-MNIST by default, CIFAR-10 when the config
// points at its binary batches. Prints the model summary, the per-epoch LR trace with the plateau
// reductions marked, and the test accuracy; writes lr_trace.csv and lr_trace.svg beside the metrics.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/config.h"
#include "trainkit/app/main.h"
#include "trainkit/app/providers.h"
#include "trainkit/app/run.h"
#include "trainkit/log/svg_plot.h"
#include "trainkit/train/summary.h"
#include "trainkit/train/trainer.h"

namespace {

namespace fs = std::filesystem;
using namespace trainkit;

/// One epoch of the LR trace: the LR each param group trained with, and what the plateau scheduler saw.
struct TraceRow {
  int64_t epoch;
  int64_t step;
  std::vector<double> lrs;
  double train_loss;
  double val_loss;
  double val_accuracy;
  double seconds;  ///< wall time since fit() began
};

/// Records the LR trace. The per-epoch scheduler steps before on_epoch_end, so the LRs are read after each
/// optimizer step instead: the last step's LRs are the ones the epoch trained with, and a reduction shows
/// as a lower LR in the next row.
class LrTrace : public train::Callback {
 public:
  void on_train_begin(train::Trainer&) override { start_ = std::chrono::steady_clock::now(); }

  bool on_step_end(train::Trainer& trainer, const train::StepEvent&) override {
    lrs_.clear();
    for (const auto& group : trainer.optimizer().param_groups()) {
      lrs_.push_back(group.options().get_lr());
    }
    return false;
  }

  bool on_epoch_end(train::Trainer&, const train::EpochEvent& event) override {
    rows.push_back({event.epoch, event.step, lrs_, event.train_loss, event.val ? event.val->loss : NAN,
                    event.val ? event.val->metric("accuracy") : NAN,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count()});
    return false;
  }

  std::vector<TraceRow> rows;

 private:
  std::chrono::steady_clock::time_point start_;
  std::vector<double> lrs_;
};

/// Whether the LR of group 0 dropped from the previous epoch to this one (a plateau reduction).
bool reduced(const std::vector<TraceRow>& rows, size_t i) { return i > 0 && rows[i].lrs[0] < rows[i - 1].lrs[0]; }

void write_trace(const std::vector<TraceRow>& rows, const fs::path& dir, const std::string& title) {
  std::ofstream csv(dir / "lr_trace.csv");
  csv << "epoch,step,lr,train_loss,val_loss,val_accuracy,seconds,reduced\n";
  log::Series lr{"lr (group 0)", {}, {}, true};
  log::Series val{"validation loss", {}, {}, true};
  log::SvgPlot plot(log::PlotOptions().title(title).x_label("epoch").log_y(true));
  for (size_t i = 0; i < rows.size(); ++i) {
    const TraceRow& r = rows[i];
    csv << fmt::format("{},{},{:.8g},{:.6f},{:.6f},{:.6f},{:.1f},{}\n", r.epoch + 1, r.step, r.lrs[0], r.train_loss,
                       r.val_loss, r.val_accuracy, r.seconds, reduced(rows, i) ? 1 : 0);
    lr.x.push_back(static_cast<double>(r.epoch + 1));
    lr.y.push_back(r.lrs[0]);
    val.x.push_back(static_cast<double>(r.epoch + 1));
    val.y.push_back(r.val_loss);
    if (reduced(rows, i)) {
      plot.add_vline(static_cast<double>(r.epoch + 1), fmt::format("lr {:.3g}", r.lrs[0]));
    }
  }
  plot.add_series(std::move(lr));
  plot.add_series(std::move(val));
  plot.save((dir / "lr_trace.svg").string());
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"ResNet + ReduceLROnPlateau on Fashion-MNIST (or CIFAR-10): model summary, LR trace with the "
                         "plateau reductions, test accuracy"};
  std::string config_path = "configs/image_classification.toml";
  std::vector<std::string> overrides;
  std::string out_dir = "image_classification";
  std::string dataset;
  std::string data_dir;
  int64_t epochs = 0;
  int64_t limit_train = -1;
  int64_t depth = 0;
  cli.option("--config", config_path, "Training config").show_default();
  cli.option("--set", overrides, "Override one key: section.key=value (repeatable)");
  cli.option("--out", out_dir, "Run directory (metrics, lr_trace.csv/svg, checkpoints)").show_default();
  cli.option("--dataset", dataset, "\"fashion-mnist\" or \"cifar10\" (default: the config's data.dataset)");
  cli.option("--data-dir", data_dir,
             "Directory of the data set (Fashion-MNIST IDX files, or CIFAR-10's cifar-10-batches-bin)");
  cli.option("--epochs", epochs, "Epochs (default: the config's)").positive();
  cli.option("--limit-train", limit_train, "Use only the first N training images (0 = all; default: the config's)")
      .non_negative();
  cli.option("--depth", depth, "CIFAR ResNet depth 6n+2: 8, 14, 20, 32, 56 ... (default: the config's)").positive();
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");

  return trainkit::app::run_main([&] {
    // Options go before --set overrides, so that an explicit --set wins.
    std::vector<std::string> all;
    if (!dataset.empty()) {
      all.push_back("data.dataset=" + dataset);
    }
    if (!data_dir.empty()) {
      all.push_back("data.dir=" + data_dir);
    }
    if (epochs > 0) {
      all.push_back(fmt::format("train.epochs={}", epochs));
    }
    if (limit_train >= 0) {
      all.push_back(fmt::format("data.limit_train={}", limit_train));
    }
    if (depth > 0) {
      all.push_back(fmt::format("model.depth={}", depth));
    }
    all.insert(all.end(), overrides.begin(), overrides.end());
    const app::Config config = app::load_config(config_path, all);
    if (config.data.val_size == 0) {
      throw app::ConfigError(config_path + ": ReduceLROnPlateau watches the validation loss: data.val_size must be > 0");
    }
    if (fs::exists(fs::path(out_dir) / "metrics.csv")) {
      throw app::UsageError(fmt::format("{} already holds a run (metrics.csv); choose another --out", out_dir));
    }
    app::Run run = app::build_run(config, config_path, app::RunOptions().dir(out_dir).progress("lines"));
    train::Trainer& trainer = *run.trainer;
    const at::Tensor example = run.val_split.images.narrow(0, 0, 1).to(run.device);
    torch::nn::Sequential model(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(run.model));  // an image model
    fmt::print("{}\n", train::summary(model, example).to_string());

    auto trace = std::make_shared<LrTrace>();
    trainer.add_callback(trace);
    spdlog::info("{} on {}: {} train / {} validation / {} test images, {} epochs, batch {}, scheduler {}",
                 config.model.name == "resnet"
                     ? fmt::format("ResNet-{}",
                                   app::read_extra(config, "model", app::ImageModelOptions::binding()).resnet().depth())
                     : config.model.name,
                 config.data.dataset, run.train_split.images.size(0), run.val_split.images.size(0),
                 run.test_split.images.size(0), config.trainer.epochs(), config.train.batch_size,
                 run.scheduler ? run.scheduler->scheduler->name() : std::string("none"));
    const auto start = std::chrono::steady_clock::now();
    trainer.fit(*run.train, run.val.get());
    const train::EvalResult test = trainer.evaluate(*run.test);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    const std::vector<TraceRow>& rows = trace->rows;
    fmt::print("\n{:>5} {:>7} {:>10} {:>11} {:>9} {:>8} {:>8}\n", "epoch", "step", "lr", "train loss", "val loss",
               "val acc", "time s");
    for (size_t i = 0; i < rows.size(); ++i) {
      const TraceRow& r = rows[i];
      fmt::print("{:>5} {:>7} {:>10.3g} {:>11.4f} {:>9.4f} {:>8.4f} {:>8.0f}{}\n", r.epoch + 1, r.step, r.lrs[0],
                 r.train_loss, r.val_loss, r.val_accuracy, r.seconds, reduced(rows, i) ? "  <- plateau: lr reduced" : "");
    }
    fmt::print("test: accuracy {:.4f}, loss {:.4f} after {} epochs, {:.0f} s wall time\n", test.metric("accuracy"),
               test.loss, rows.size(), seconds);
    write_trace(rows, out_dir,
                fmt::format("{} on {}: lr and validation loss", config.model.name, config.data.dataset));
    fmt::print("wrote {0}/lr_trace.csv, {0}/lr_trace.svg, {0}/metrics.csv\n", out_dir);
    return 0;
  });
}
