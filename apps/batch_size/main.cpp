// batch_size: the seed's batch-size sweep on Fashion-MNIST (the same CNN and Adam trained at batch
// sizes 32, 64, 128, 256: training loss, validation accuracy and time per epoch), then the batch-size
// finder (Lightning's power and binsearch modes, and throughput) on the same model under a CPU memory
// budget, with every size it tried.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/config.h"
#include "trainkit/app/jobs.h"
#include "trainkit/app/main.h"
#include "trainkit/app/run.h"
#include "trainkit/train/trainer.h"
#include "trainkit/tune/batch_size_finder.h"

namespace {

using namespace trainkit;

/// Keeps the last epoch's results.
class EpochRecorder : public train::Callback {
 public:
  bool on_epoch_end(train::Trainer&, const train::EpochEvent& event) override {
    last = event;
    return false;
  }
  std::optional<train::EpochEvent> last;
};

struct SweepRow {
  int64_t batch_size = 0;
  int64_t steps_per_epoch = 0;
  int64_t samples = 0;  ///< training samples per epoch
  double train_loss = 0;
  double val_loss = 0;
  double val_accuracy = 0;
  double seconds_per_epoch = 0;
};

SweepRow sweep_one(app::Config config, const std::string& config_path, int64_t batch_size) {
  config.train.batch_size = batch_size;
  app::Run run = app::build_run(config, config_path);
  train::Trainer& trainer = *run.trainer;
  auto recorder = std::make_shared<EpochRecorder>();
  trainer.add_callback(recorder);
  const auto start = std::chrono::steady_clock::now();
  trainer.fit(*run.train, run.val.get());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  SweepRow row;
  row.batch_size = batch_size;
  row.steps_per_epoch = run.steps_per_epoch;
  row.samples = run.train_split.images.size(0);
  row.train_loss = recorder->last ? recorder->last->train_loss : 0.0;
  if (recorder->last && recorder->last->val) {
    row.val_loss = recorder->last->val->loss;
    row.val_accuracy = recorder->last->val->metric("accuracy");
  }
  row.seconds_per_epoch = seconds / static_cast<double>(config.trainer.epochs());
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"Batch-size sweep (32, 64, 128, 256) on Fashion-MNIST and the batch-size finder's answers"};
  std::string config_path = "configs/batch_size.toml";
  std::vector<std::string> overrides;
  std::vector<int64_t> sizes{32, 64, 128, 256};
  std::vector<std::string> modes{"power", "binsearch", "throughput"};
  double budget_mib = 256;
  int64_t steps_per_trial = 3;
  int64_t init_val = 2;
  int64_t max_trials = 25;
  bool full = false;
  bool skip_sweep = false;
  bool skip_finder = false;
  std::string csv_path;
  cli.option("--config", config_path, "Training config (model, optimizer, data, epochs)").show_default();
  cli.option("--set", overrides, "Override one key: section.key=value (repeatable)");
  cli.option("--sizes", sizes, "Batch sizes of the sweep").show_default().positive();
  cli.flag("--full", full, "Sweep on the whole training set (55k, 5k validation)");
  cli.flag("--skip-sweep", skip_sweep, "Only run the finder");
  cli.flag("--skip-finder", skip_finder, "Only run the sweep");
  cli.option("--mode", modes, "Finder modes: power, binsearch, throughput").show_default()
      .one_of({"power", "binsearch", "throughput"});
  cli.option("--memory-budget-mib", budget_mib,
             "CPU budget: a trial fails when the peak resident memory it adds exceeds this (MiB)")
      .show_default()
      .positive();
  cli.option("--steps-per-trial", steps_per_trial, "Optimizer steps per tried size").show_default().positive();
  cli.option("--init-val", init_val, "First size tried").show_default().positive();
  cli.option("--max-trials", max_trials, "Most trials").show_default().positive();
  cli.option("--csv", csv_path, "Also write the sweep and the finder's trials to this CSV file");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  app::set_log_level("info");
  if (full) {
    overrides.insert(overrides.begin(), {"data.limit_train=0", "data.val_size=5000"});
  }

  return app::run_main([&] {
    std::ofstream csv;
    if (!csv_path.empty()) {
      csv.open(csv_path);
      if (!csv) {
        throw std::runtime_error(csv_path + ": cannot open for writing");
      }
      csv << "part,mode,batch_size,fits,train_loss,val_loss,val_accuracy,seconds_per_epoch,samples_per_second,"
             "peak_mib\n";
    }
    const app::Config config = app::load_config(config_path, overrides);
    if (!skip_sweep) {
      fmt::print("sweep: {}, {} epoch(s) per batch size, {} lr {}{}\n", config_path, config.trainer.epochs(),
                 config.optimizer.name, config.optimizer.options->get_lr(),
                 config.data.val_size > 0 ? fmt::format(", {} validation images", config.data.val_size) : "");
      fmt::print("{:>10} {:>11} {:>11} {:>9} {:>8} {:>12} {:>10}\n", "batch size", "steps/epoch", "train loss",
                 "val loss", "val acc", "s per epoch", "samples/s");
      for (const int64_t size : sizes) {
        const SweepRow r = sweep_one(config, config_path, size);
        const double rate = r.seconds_per_epoch > 0 ? static_cast<double>(r.samples) / r.seconds_per_epoch : 0.0;
        fmt::print("{:>10} {:>11} {:>11.4f} {:>9.4f} {:>8.4f} {:>12.1f} {:>10.0f}\n", r.batch_size, r.steps_per_epoch,
                   r.train_loss, r.val_loss, r.val_accuracy, r.seconds_per_epoch, rate);
        if (csv) {
          csv << fmt::format("sweep,,{},true,{},{},{},{},{},\n", r.batch_size, r.train_loss, r.val_loss, r.val_accuracy,
                             r.seconds_per_epoch, rate);
        }
      }
      fmt::print("({} training images per epoch; the time per epoch includes the validation pass)\n\n",
                 config.data.limit_train > 0 ? config.data.limit_train - config.data.val_size : int64_t{60000} - config.data.val_size);
    }
    if (!skip_finder) {
      for (const std::string& mode : modes) {
        app::BatchSizeJobOptions job;
        job.finder.mode(mode)
            .steps_per_trial(steps_per_trial)
            .init_val(init_val)
            .max_trials(max_trials)
            .memory_budget(static_cast<int64_t>(budget_mib * 1024 * 1024));
        const auto r = app::run_batch_size_job(config, config_path, job);  // logs every trial
        fmt::print("answer ({}): batch size {}\n\n", mode, r.batch_size);
        if (csv) {
          for (const auto& t : r.trials) {
            csv << fmt::format("finder,{},{},{},,,,,{},{}\n", mode, t.batch_size, t.fits ? "true" : "false",
                               t.samples_per_second, static_cast<double>(t.peak_bytes) / (1024.0 * 1024.0));
          }
        }
      }
    }
    if (csv) {
      fmt::print("wrote {}\n", csv_path);
    }
    return 0;
  });
}
