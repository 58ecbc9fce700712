#include "trainkit/app/jobs.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "trainkit/app/toml_args.h"
#include "trainkit/compat.h"
#include "trainkit/data/transforms.h"
#include "trainkit/io/export.h"
#include "trainkit/log/metrics.h"
#include "trainkit/nn/script_module.h"
#include "trainkit/train/callback.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/summary.h"
#if TRAINKIT_WITH_DISTRIBUTED
#include "trainkit/dist/checkpoint_group.h"
#endif

namespace trainkit::app {
namespace {

namespace fs = std::filesystem;

volatile sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

/// While it lives, SIGTERM (a scheduler's or the launcher's) asks training to stop: the handler only sets a
/// flag, which StopOnSignal reads at the next step boundary. SA_RESETHAND: a second SIGTERM ends the
/// process at once. The previous disposition comes back when it dies.
class ScopedStopSignal {
 public:
  ScopedStopSignal() {
    g_stop_signal = 0;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    action.sa_flags = SA_RESETHAND;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, &previous_);
  }
  ScopedStopSignal(const ScopedStopSignal&) = delete;
  ScopedStopSignal& operator=(const ScopedStopSignal&) = delete;
  ~ScopedStopSignal() { sigaction(SIGTERM, &previous_, nullptr); }
  /// The signal received, 0 when none was.
  static int received() { return g_stop_signal; }

 private:
  struct sigaction previous_ {};
};

/// The signal any rank received (0: none), the same on every rank: a collective (or, in one process, this
/// process's own).
using AgreeOnSignal = std::function<int(int received)>;

/// Stops fit() at the step (or epoch) boundary after ScopedStopSignal saw the signal; TrainerCheckpoint's
/// on_train_end then saves that step. Under a process group the ranks agree at every boundary (`agree`: one
/// 8-byte all-reduce on the CPU), so that all stop at the same step even when the signal reaches them at
/// different steps, or reaches one of them only: a rank that stopped alone would leave the others waiting in
/// a collective it never joins, and its checkpoint could not be committed.
class StopOnSignal : public train::Callback {
 public:
  explicit StopOnSignal(AgreeOnSignal agree) : agree_(std::move(agree)) {}
  bool on_step_end(train::Trainer&, const train::StepEvent&) override { return stop(); }
  bool on_epoch_end(train::Trainer&, const train::EpochEvent&) override { return stop(); }
  /// The signal that stopped training (0: none did).
  int signal() const { return signal_; }

 private:
  bool stop() {
    signal_ = agree_(ScopedStopSignal::received());
    return signal_ != 0;
  }
  AgreeOnSignal agree_;
  int signal_ = 0;
};

std::string default_run_dir(const std::string& config_path) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  return (fs::path("runs") / fmt::format("{}-{}", fs::path(config_path).stem().string(), stamp)).string();
}

/// summary.json: the job's result, what the run measured of its precision, clipping and accumulation, the
/// step-time profile in total and per epoch, and under the launcher what rank 0 sent. Non-finite numbers (a
/// diverged run's losses) are written as null.
std::string summary_json(const TrainJobResult& result, const train::StepTimes& step_times,
                         const std::vector<train::StepTimes>& epoch_step_times, bool distributed) {
  nlohmann::ordered_json json;
  for (const auto& [name, value] : result.test_metrics.items()) {
    json["test_" + name] = value;
  }
  json["test_loss"] = result.test_loss;
  json["epochs"] = result.epochs;
  json["steps"] = result.steps;
  json["finished"] = result.finished;
  json["wall_seconds"] = result.wall_seconds;
  json["train_samples_per_second"] = result.train_samples_per_second;
  if (result.autocast_dtype.empty()) {
    json["autocast_dtype"] = nullptr;
  } else {
    json["autocast_dtype"] = result.autocast_dtype;
  }
  json["clipped_steps"] = result.clipped_steps;
  json["micro_batches_per_step"] = result.micro_batches_per_step;
  json["step_times"] = nlohmann::ordered_json::parse(step_times.to_json());
  json["epoch_step_times"] = nlohmann::ordered_json::array();
  for (const train::StepTimes& t : epoch_step_times) {
    json["epoch_step_times"].push_back(nlohmann::ordered_json::parse(t.to_json()));
  }
  if (!result.time_to_accuracy.empty()) {
    json["time_to_accuracy"] = nlohmann::ordered_json::array();
    for (const AccuracyReached& r : result.time_to_accuracy) {
      nlohmann::ordered_json entry;
      entry["threshold"] = r.threshold;
      if (r.reached) {
        entry["seconds"] = r.seconds;
        entry["epoch"] = r.epoch;
        entry["step"] = r.step;
        entry["accuracy"] = r.accuracy;
      } else {
        entry["seconds"] = nullptr;
      }
      json["time_to_accuracy"].push_back(entry);
    }
  }
  if (distributed) {
    json["all_reduces"] = result.all_reduces;
    json["all_reduce_bytes"] = result.all_reduce_bytes;
    json["zero_stage"] = result.zero_stage;
    json["optimizer_state_bytes"] = result.optimizer_state_bytes;
  }
  json["torch_version"] = compat::torch_version();
  return json.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

/// log.time_to_accuracy: at each validation (epoch ends and mid-epoch points), the thresholds that the
/// validation accuracy reached for the first time, with the wall time since `start`.
class TimeToAccuracy : public train::Callback {
 public:
  TimeToAccuracy(const std::vector<double>& thresholds, std::chrono::steady_clock::time_point start)
      : start_(start) {
    for (const double t : thresholds) {
      reached_.push_back(AccuracyReached{t});
    }
  }
  bool on_validation_point(train::Trainer&, const train::EpochEvent& event) override {
    record(event);
    return false;
  }
  bool on_epoch_end(train::Trainer&, const train::EpochEvent& event) override {
    record(event);
    return false;
  }
  const std::vector<AccuracyReached>& reached() const { return reached_; }

 private:
  void record(const train::EpochEvent& event) {
    const std::optional<double> accuracy = event.metrics.find("val/accuracy");
    if (!accuracy) {
      return;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    for (AccuracyReached& r : reached_) {
      if (!r.reached && *accuracy >= r.threshold) {
        r.reached = true;
        r.seconds = seconds;
        r.epoch = event.epoch + 1;
        r.step = event.step;
        r.accuracy = *accuracy;
      }
    }
  }
  std::chrono::steady_clock::time_point start_;
  std::vector<AccuracyReached> reached_;
};

/// Where the run goes and which checkpoint it resumes from; checks everything before anything is written.
struct RunPlan {
  std::string dir;
  std::string resume_from;  // empty: fresh run
};

/// Whether `dir` is a trainkit run: its config.toml parses and has the [data], [model] and [train] tables
/// that every run's config.toml has.
bool is_run_directory(const fs::path& dir) {
  const fs::path config = dir / "config.toml";
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) {
    return false;
  }
  std::ifstream in(config);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    const ArgTable table = parse_toml(text, config.string());
    const auto has_table = [&table](const std::string& section) {
      return std::any_of(table.begin(), table.end(), [&section](const auto& entry) {
        return entry.first == section && entry.second.template get_if<ArgTable>() != nullptr;
      });
    };
    return has_table("data") && has_table("model") && has_table("train");
  } catch (const std::exception&) {
    return false;
  }
}

/// Refuses an --out that would overwrite someone else's files: an existing directory that holds more than
/// logs (a caller may redirect a log there first, as `trainkit tune` does with train.log) and the files of
/// `trainkit lr-find` (whose suggestion a run in the same directory often follows), and is not a trainkit run.
void check_out_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    return;
  }
  if (!fs::is_directory(dir, ec)) {
    throw UsageError(fmt::format("--out {}: exists and is not a directory", dir.string()));
  }
  std::vector<std::string> others;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".log" && name != "lr_find.csv" && name != "lr_find.svg") {
      others.push_back(name);
    }
  }
  if (others.empty() || is_run_directory(dir)) {
    return;
  }
  std::sort(others.begin(), others.end());
  const size_t shown = std::min<size_t>(others.size(), 3);
  throw UsageError(fmt::format(
      "--out {}: the directory holds {}{} and is not a trainkit run (no config.toml of one), whose config.toml, "
      "metrics and checkpoints a run would write there; choose a new or empty directory",
      dir.string(), fmt::join(others.begin(), others.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
      others.size() > shown ? fmt::format(" and {} more", others.size() - shown) : ""));
}

RunPlan plan_run(const TrainJobOptions& options) {
  RunPlan plan;
  if (options.resume.empty() || options.resume == "auto") {
    plan.dir = options.out_dir.empty() ? default_run_dir(options.config_path) : options.out_dir;
  } else {
    if (!fs::is_regular_file(options.resume)) {
      throw UsageError(fmt::format("--resume {}: no such checkpoint file", options.resume));
    }
    const fs::path ckpt_dir = fs::path(options.resume).parent_path();
    plan.dir = options.out_dir.empty() ? (ckpt_dir.has_parent_path() ? ckpt_dir.parent_path().string() : ".")
                                       : options.out_dir;
    plan.resume_from = options.resume;
  }
  check_out_directory(plan.dir);
  const train::CheckpointManager manager((fs::path(plan.dir) / "checkpoints").string(), 1);
  const auto existing = manager.list();
  if (options.resume == "auto") {
    if (options.out_dir.empty()) {
      throw UsageError("--resume auto needs --out DIR (the run directory to continue)");
    }
  } else if (options.resume.empty() && !existing.empty()) {
    throw UsageError(fmt::format("{} already holds a run ({} checkpoints); pass --resume auto to continue it "
                                 "or choose another --out",
                                 plan.dir, existing.size()));
  }
  return plan;
}

/// The checkpoint this rank resumes from: the file or commit record named by --resume, or with --resume auto
/// the newest one of the run's checkpoints that verifies (none: a fresh run).
std::optional<train::CheckpointEntry> resume_point(const RunPlan& plan, const TrainJobOptions& options,
                                                   const std::string& checkpoints) {
  if (!plan.resume_from.empty()) {
    if (fs::path(plan.resume_from).extension() != ".commit") {
      train::CheckpointEntry whole;
      whole.files = {plan.resume_from};
      return whole;  // any checkpoint file, by name
    }
    try {
      return train::verify_commit(plan.resume_from);
    } catch (const train::CheckpointError& e) {
      throw UsageError(fmt::format("--resume {}: not a complete checkpoint: {}", plan.resume_from, e.what()));
    }
  }
  if (options.resume != "auto") {
    return std::nullopt;
  }
  auto latest = train::CheckpointManager(checkpoints, 1).latest();
  if (!latest) {
    spdlog::info("--resume auto: no usable checkpoint in {}, starting fresh", checkpoints);
  }
  return latest;
}

}  // namespace

TrainJobResult run_train_job(const TrainJobOptions& options) {
  const auto wall_start = std::chrono::steady_clock::now();
  const Config config = load_config(options.config_path, options.overrides, options.catalog.extensions());
  const RunPlan plan = plan_run(options);

  // The checkpoint is chosen before the run is built, so that the metrics files know whether they continue
  // a run; it is restored after DDP's broadcast, so every rank loads the same state.
  const std::string checkpoints = (fs::path(plan.dir) / "checkpoints").string();
  const std::optional<train::CheckpointEntry> resume = resume_point(plan, options, checkpoints);
  Run run = build_run(config, options.config_path,
                      RunOptions().dir(plan.dir).append_metrics(resume.has_value()).distributed(true),
                      options.catalog);
  train::Trainer& trainer = *run.trainer;
#if TRAINKIT_WITH_DISTRIBUTED
  if (run.group && !(resume && resume->step < 0)) {
    // Every rank chose on its own; a rank that sees other files (a directory the ranks do not share) must
    // not resume another step than the others. (A whole file named by --resume has no step to compare.)
    train::check_same_checkpoint(resume ? resume->step : -1, checkpoints, dist::checkpoint_group(run.group));
  }
#endif
  if (resume) {
    const std::string resume_path = resume->file_for(run.rank, run.world_size);
    const auto mismatch = [&resume](const char* why) {
      return train::CheckpointError(
          fmt::format("{}: does not match this config's model or optimizer: {}", resume->name(), why));
    };
    try {
      torch::serialize::InputArchive archive;
      train::load_checkpoint(resume_path, archive);
#if TRAINKIT_WITH_DISTRIBUTED
      // A checkpoint of another number of ranks: the part ("optimizer", or stage 3's "model") of the other
      // ranks' shards that this rank's parameters come from.
      const dist::ShardReader shard = [entry = *resume](int64_t rank, int64_t world_size)
          -> std::unique_ptr<torch::serialize::InputArchive> {
        if (world_size != entry.world_size() || rank < 0 || rank >= world_size) return nullptr;
        auto whole = std::make_unique<torch::serialize::InputArchive>();
        train::load_checkpoint(entry.files[static_cast<size_t>(rank)], *whole);
        return whole;
      };
      if (run.zero != nullptr) run.zero->set_shard_reader(dist::nested_shard_reader(shard, "optimizer"));
      if (run.fsdp) run.fsdp->set_shard_reader(dist::nested_shard_reader(shard, "model"));
#endif
      trainer.load(archive);
#if TRAINKIT_WITH_DISTRIBUTED
      if (run.zero != nullptr) run.zero->set_shard_reader(nullptr);
      if (run.fsdp) run.fsdp->set_shard_reader(nullptr);
#endif
    } catch (const c10::Error& e) {  // LibTorch's archive reader (a missing key or a shape)
      throw mismatch(e.what_without_backtrace());
    } catch (const std::invalid_argument& e) {  // trainkit's own checks of the loaded state
      throw mismatch(e.what());
    }
    spdlog::info("resumed from {} at epoch {}, step {}{}", resume->name(), trainer.state().epoch + 1,
                 trainer.state().step,
                 resume->world_size() == run.world_size
                     ? std::string()
                     : fmt::format(" (saved by {} rank{}, resharded onto {})", resume->world_size(),
                                   resume->world_size() == 1 ? "" : "s", run.world_size));
  }
  if (run.main_rank()) {
    train::write_file_atomic((fs::path(plan.dir) / "config.toml").string(), to_toml(config));
  }

  auto sequential = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(run.model);
#if TRAINKIT_WITH_DISTRIBUTED
  if (run.fsdp) sequential = nullptr;  // no plain forward: each rank holds only its parameters
#endif
  if (sequential) {
    run.test->set_epoch(0);  // one test batch as the example for the output shapes (evaluate() restarts it)
    if (const auto example = run.test->next()) {
      torch::nn::Sequential model(sequential);
      spdlog::info("model {}:\n{}", config.model.name,
                   train::summary(model, example->input().narrow(0, 0, 1)).to_string());
    }
  } else {
    spdlog::info("model {}:\n{}", config.model.name, train::summary(*run.model).to_string());
  }
  spdlog::info("training {} on {} ({} train, {} val, {} test examples) with {}, run directory {}",
               config.model.name, run.device.str(), run.train_examples, run.val_examples, run.test_examples,
               config.optimizer.name, plan.dir);
  int stop_signal = 0;
  AgreeOnSignal agree = [](int received) { return received; };
#if TRAINKIT_WITH_DISTRIBUTED
  if (run.group) {
    agree = [group = run.group](int received) {
      at::Tensor flag = torch::tensor({static_cast<int64_t>(received)});  // on the CPU: no device sync per step
      group->all_reduce(flag, dist::ReduceOp::MAX).wait();
      return static_cast<int>(flag.item<int64_t>());
    };
  }
#endif
  const auto stop_on_signal = std::make_shared<StopOnSignal>(agree);
  trainer.add_callback(stop_on_signal);
  const auto time_to_accuracy = std::make_shared<TimeToAccuracy>(config.log.time_to_accuracy, wall_start);
  trainer.add_callback(time_to_accuracy);
  try {
    const ScopedStopSignal stop_on_sigterm;
    trainer.fit(*run.train, run.val.get());
    // A signal after the last boundary: the ranks agree once more, so that all finish or all stop.
    stop_signal = agree(std::max(stop_on_signal->signal(), ScopedStopSignal::received()));
  } catch (...) {
    if (run.mlflow) run.mlflow->finish("FAILED");
    throw;
  }
  if (stop_signal != 0) {
    // Stopped early: the checkpoint of this step is written (TrainerCheckpoint::on_train_end, atomically);
    // the test evaluation and the exports are left to the run that finishes.
    TrainJobResult stopped;
    stopped.run_dir = plan.dir;
    stopped.epochs = trainer.state().epoch;
    stopped.steps = trainer.state().step;
    stopped.stop_signal = stop_signal;
    stopped.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    const std::string saved = run.checkpoints != nullptr && !run.checkpoints->list().empty()
                                  ? "; checkpoint " + run.checkpoints->list().back()
                                  : "";
    spdlog::warn("stopped by signal {} ({}) at epoch {}, step {}{}; continue with --resume auto --out {}",
                 stop_signal, strsignal(stop_signal), trainer.state().epoch + 1, trainer.state().step, saved, plan.dir);
    if (run.mlflow) run.mlflow->finish("KILLED");
    return stopped;
  }

  const train::EvalResult test_result = trainer.evaluate(*run.test);
#if TRAINKIT_WITH_DISTRIBUTED
  if (run.fsdp) {
    // Training is over: rank 0's model gets every parameter in full for the exports (collective).
    const auto full = run.fsdp->full_state_dict();
    if (run.main_rank()) {
      torch::NoGradGuard no_grad;
      for (auto& item : run.model->named_parameters()) item.value().set_data(full[item.key()]);
    }
  }
#endif
  // The averaged weights, evaluated on the test set beside the raw ones and exported weights-only.
  const auto report_averaged = [&](const char* what, const std::vector<at::Tensor>& values, bool bn) {
    train::ScopedWeights scope(*run.model, values);
    if (bn) {
      train::update_bn(*run.model, run.forward, *run.train);
    }
    const train::EvalResult r = trainer.evaluate(*run.test);
    std::string text;
    for (const auto& [name, value] : r.metrics.items()) {
      text += fmt::format(", test {} {:.4f}", name, value);
    }
    spdlog::info("{} weights: test loss {:.4f}{}", what, r.loss, text);
    if (run.main_rank() && !plan.dir.empty()) {
      train::save_weights(*run.model, (fs::path(plan.dir) / fmt::format("{}.pt", what)).string());
      io::export_weights(*run.model, plan.dir, what, config.checkpoint.export_formats);
    }
  };
  if (run.main_rank() && !plan.dir.empty()) {
    io::export_weights(*run.model, plan.dir, "model", config.checkpoint.export_formats);  // the raw final weights
    const auto& formats = config.checkpoint.export_formats;
    auto script = std::dynamic_pointer_cast<nn::ScriptModuleImpl>(run.model);
    if (script && std::find(formats.begin(), formats.end(), "torchscript") == formats.end()) {
      script->save((fs::path(plan.dir) / "model.torchscript.pt").string());  // always, for torch.jit.load in Python
    }
  }
  if (run.ema) {
    report_averaged("ema", run.ema->ema().values(), false);
  }
  if (run.swa && run.swa->averaged().n_averaged() > 0) {
    report_averaged("swa", run.swa->averaged().values(), true);
  }
  TrainJobResult result;
  result.run_dir = plan.dir;
  result.test_loss = test_result.loss;
  result.test_metrics = test_result.metrics;
  result.epochs = trainer.state().epoch;
  result.steps = trainer.state().step;
  result.finished = trainer.state().epoch >= config.trainer.epochs();
  result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  result.time_to_accuracy = time_to_accuracy->reached();
  if (const auto& autocast = trainer.autocast()) {
    result.autocast_dtype = autocast->second == torch::kFloat16 ? "float16"
                            : autocast->second == torch::kBFloat16 ? "bfloat16"
                                                                    : c10::toString(autocast->second);
  }
  if (run.group) {
    const dist::CommStats comm = run.group->stats();
    result.all_reduces = comm.all_reduces;
    result.all_reduce_bytes = comm.all_reduce_bytes;
    result.zero_stage = run.zero != nullptr ? run.zero->stage() : 0;
    result.optimizer_state_bytes = run.zero != nullptr ? run.zero->local_state_bytes()
                                                       : dist::optimizer_state_bytes(*run.optimizer);
  }
  if (!run.main_rank()) {
    return result;  // rank 0 writes the run directory
  }
  // Rank 0 counts its own shard; every rank trains as many samples, so the job's rate is world times that.
  const auto& logging = *run.logging;
  result.train_samples_per_second =
      logging.train_seconds() > 0 ? static_cast<double>(run.world_size) *
                                        static_cast<double>(logging.samples_trained()) / logging.train_seconds()
                                  : 0.0;

  log::MetricRow row;
  row.kind = "test";
  row.step = result.steps;
  row.epoch = result.epochs;
  row.val_loss = result.test_loss;
  row.val_metrics = result.test_metrics.items();
  run.metrics->write(row);
  if (run.tensorboard) {
    for (const auto& [name, value] : result.test_metrics.items()) {
      run.tensorboard->add_scalar("test/" + name, value, result.steps);
    }
    run.tensorboard->add_scalar("test/loss", result.test_loss, result.steps);
    run.tensorboard->close();
  }
  std::string test_metrics_text;
  for (const auto& [name, value] : result.test_metrics.items()) {
    test_metrics_text += fmt::format(", test {} {:.4f}", name, value);
  }
  const train::StepTimes step_times = logging.step_times();
  result.clipped_steps = logging.clipped_steps();
  result.micro_batches_per_step = step_times.steps > 0 ? static_cast<double>(step_times.micro_batches) /
                                                             static_cast<double>(step_times.steps)
                                                       : 0.0;
  if (step_times.steps > 0) {
    spdlog::info("time: {}", step_times.to_string());
  }
  log::write_curves_svg((fs::path(plan.dir) / "metrics.csv").string(), (fs::path(plan.dir) / "curves.svg").string(),
                        fs::path(options.config_path).stem().string());
  train::write_file_atomic((fs::path(plan.dir) / "summary.json").string(),
                           summary_json(result, step_times, logging.epoch_step_times(), run.group != nullptr));
  spdlog::info("test loss {:.4f}{} after {} epochs ({} steps) in {:.1f} s; {}", result.test_loss, test_metrics_text,
               result.epochs, result.steps, result.wall_seconds, plan.dir);
  if (run.mlflow) {
    // The run's files and its exported weights, then the run's end (waiting for a restarting server).
    std::vector<std::string> artifacts = {"config.toml", "metrics.csv", "curves.svg", "summary.json"};
    for (const char* stem : {"model", "ema", "swa"}) {
      for (const std::string& path : io::export_paths(plan.dir, stem, config.checkpoint.export_formats)) {
        artifacts.push_back(fs::path(path).filename().string());
      }
    }
    if (std::find(artifacts.begin(), artifacts.end(), "model.torchscript.pt") == artifacts.end()) {
      artifacts.emplace_back("model.torchscript.pt");
    }
    for (const std::string& name : artifacts) {
      if (fs::exists(fs::path(plan.dir) / name)) run.mlflow->log_artifact((fs::path(plan.dir) / name).string());
    }
    const log::MlflowLoggerStats sent = run.mlflow->finish("FINISHED");
    spdlog::info("MLflow: run {}: {} metric points and {} artifacts sent", run.mlflow->run_id(), sent.metrics_sent,
                 sent.artifacts_sent);
  }
  return result;
}


LrFindJobResult run_lr_find_job(const Config& config, const std::string& source, const LrFindJobOptions& options,
                                const Catalog& catalog) {
  if (options.use_val && config.data.val_size == 0) {
    throw ConfigError(source + ": --val needs data.val_size > 0");
  }
  Run run = build_run(config, source, {}, catalog);
  tune::LRFinder finder(run.model, run.forward, *run.optimizer, run.loss);
  // The test runs in the precision the run trains in: the [amp] autocast and GradScaler the Trainer got.
  if (const auto& autocast = run.trainer->autocast()) {
    finder.set_autocast(autocast->first, autocast->second);
  }
  finder.set_grad_scaler(run.trainer->grad_scaler());
  spdlog::info("LR range test: {} to {} over {} steps ({}), batch {}{}{}", options.finder.start_lr(),
               options.finder.end_lr(), options.finder.num_iter(), options.finder.step_mode(), config.train.batch_size,
               run.trainer->autocast() ? fmt::format(", autocast {}", config.amp.dtype) : "",
               run.trainer->grad_scaler() ? ", GradScaler" : "");
  LrFindJobResult result;
  result.curve = finder.range_test(*run.train, options.use_val ? run.val.get() : nullptr, options.finder);
  if (result.curve.diverged) {
    spdlog::info("stopped early at lr {:.3g}: the loss diverged", result.curve.lrs.back());
  }
  if (const int64_t skipped = result.curve.skipped_steps(); skipped > 0) {
    spdlog::info("the GradScaler skipped {} of {} steps (inf/NaN gradients; marked in lr_find.csv)", skipped,
                 result.curve.lrs.size());
  }
  using Suggest = std::function<std::optional<tune::Suggestion>(const tune::LRFinderResult&, std::string*)>;
  const std::vector<Suggest> methods = {
      [](const tune::LRFinderResult& r, std::string* why) { return tune::suggest_steepest(r, why); },
      tune::suggest_valley, tune::suggest_minimum};
  for (const auto& suggest : methods) {
    std::string why;
    if (auto s = suggest(result.curve, &why)) {
      spdlog::info("suggested lr ({}): {:.3g}", s->method, s->lr);
      result.suggestions.push_back(*s);
    } else {
      spdlog::warn("no suggestion: {}", why);
    }
  }
  std::filesystem::create_directories(options.out_dir);
  const std::string csv = (std::filesystem::path(options.out_dir) / "lr_find.csv").string();
  const std::string svg = (std::filesystem::path(options.out_dir) / "lr_find.svg").string();
  tune::write_lr_finder_csv(result.curve, csv);
  tune::write_lr_finder_svg(result.curve, result.suggestions, svg,
                            fmt::format("LR range test ({})", source));
  spdlog::info("wrote {} and {}", csv, svg);
  return result;
}

tune::BatchSizeFinderResult run_batch_size_job(const Config& config, const std::string& source,
                                               const BatchSizeJobOptions& options, const Catalog& catalog) {
  Run run = build_run(config, source, {}, catalog);
  if (!run.train_split.images.defined()) {
    throw UsageError(fmt::format("{}: the batch-size finder slices a training split held as tensors; data.dataset = "
                                 "\"{}\" is not held that way",
                                 source, config.data.dataset));
  }
  // The finder slices the samples itself, so it takes the training split's tensors.
  // The finder slices preloaded tensors: normalized here when the run normalizes on the device.
  const at::Tensor& images = run.train_split.images;
  const at::Tensor x = (images.is_floating_point() ? images : data::normalize(images, {data::kFashionMnistMean}, {data::kFashionMnistStd})).to(run.device);
  const at::Tensor y = run.train_split.labels.to(run.device);
  const int64_t n_train = x.size(0);
  tune::BatchSizeFinder finder(run.model, run.forward, *run.optimizer, run.loss);
  tune::BatchSizeFinderOptions finder_options = options.finder;
  if (run.device.is_cuda()) {
    finder_options.memory_budget(0);
  }
  spdlog::info("batch-size finder ({}) on {} training samples, {} steps per trial, from {}{}", finder_options.mode(),
               n_train, finder_options.steps_per_trial(), finder_options.init_val(),
               finder_options.memory_budget() > 0
                   ? fmt::format(", CPU budget {:.0f} MiB", static_cast<double>(finder_options.memory_budget()) / 1048576.0)
                   : "");
  const tune::BatchSizeFinderResult result = finder.scale_batch_size(x, y, finder_options);
  for (const auto& t : result.trials) {
    spdlog::info("batch size {:>6}: {}, {:.0f} samples/s{}{}", t.batch_size, t.fits ? "fits" : "fails",
                 t.samples_per_second,
                 t.peak_bytes >= 0 ? fmt::format(", peak +{:.1f} MiB", static_cast<double>(t.peak_bytes) / 1048576.0) : "",
                 t.fits ? "" : " (" + t.failure + ")");
  }
  spdlog::info("batch size found ({}): {}", result.mode, result.batch_size);
  return result;
}

}  // namespace trainkit::app
