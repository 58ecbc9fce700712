#include "trainkit/app/tune_job.h"

#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "run_metrics.h"
#include "study_file.h"
#include "study_journal.h"
#include "trainkit/app/main.h"
#include "trainkit/app/run.h"
#include "trainkit/log/svg_plot.h"
#include "trainkit/subprocess.h"
#include "trainkit/train/checkpoint.h"

namespace trainkit::app {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using tune::SearchSpace;
using tune::Trial;
using tune::OptunaTrialState;
using tune::TrialState;

void check_options(const TuneJobOptions& o) {
  if (o.config_path.empty() || o.space_path.empty() || o.out_dir.empty()) {
    throw UsageError("tune: --config, --space and --out are required");
  }
  if (o.trials < 1) throw UsageError(fmt::format("tune: --trials must be >= 1, got {}", o.trials));
  if (o.jobs < 1) throw UsageError(fmt::format("tune: --jobs must be >= 1, got {}", o.jobs));
  if (o.startup_trials < 1) {
    throw UsageError(fmt::format("tune: --startup-trials must be >= 1, got {}", o.startup_trials));
  }
  if (o.metric.rfind("val_", 0) != 0 && o.metric.rfind("test_", 0) != 0) {
    throw UsageError(fmt::format("tune: --metric must start with val_ or test_, got \"{}\"", o.metric));
  }
  if (!o.sampler.empty() && o.sampler != "gp" && o.sampler != "tpe" && o.sampler != "random") {
    throw UsageError(fmt::format("tune: --sampler must be gp, tpe or random, got \"{}\"", o.sampler));
  }
}

/// The sampler: --sampler, else the space file's, else gp.
std::shared_ptr<tune::Sampler> make_sampler(const TuneJobOptions& o, const TuneChoices& choices) {
  const std::string name = !o.sampler.empty() ? o.sampler : !choices.sampler.empty() ? choices.sampler : "gp";
  if (name == "random") return std::make_shared<tune::RandomSampler>();
  if (name == "tpe") {
    auto tpe = choices.tpe;
    if (!choices.tpe_startup_set) tpe.n_startup_trials(o.startup_trials);
    return std::make_shared<tune::TPESampler>(tpe);
  }
  return std::make_shared<tune::GPSampler>(tune::GPSamplerOptions().n_startup_trials(o.startup_trials));
}

/// The pruner (null: none): --prune (median), else the space file's. Hyperband's max_resource "auto" is the
/// config's epochs (the steps are epochs), unless the space tunes them.
std::shared_ptr<tune::Pruner> make_pruner(const TuneJobOptions& o, const TuneChoices& choices, const SearchSpace& space,
                                          const std::string& study_name) {
  if (o.prune && !choices.pruner.empty() && choices.pruner != "median") {
    throw UsageError(fmt::format("tune: --prune (median) and {} choosing pruner = \"{}\": use one", o.space_path,
                                 choices.pruner));
  }
  const std::string name = o.prune ? "median" : choices.pruner;
  if (name.empty() || name == "none") return nullptr;
  if (o.metric.rfind("val_", 0) != 0) {
    throw UsageError(fmt::format("tune: pruner {} needs a val_ metric (the per-epoch validation rows are what it "
                                 "compares)", name));
  }
  if (name == "median") return std::make_shared<tune::MedianPruner>();
  if (name == "successive_halving") return std::make_shared<tune::SuccessiveHalvingPruner>(choices.successive_halving);
  auto hb = choices.hyperband;
  hb.study_name(study_name);
  const bool epochs_tuned = std::any_of(space.params().begin(), space.params().end(),
                                        [](const tune::Param& p) { return p.name == "train.epochs"; });
  if (!hb.max_resource() && !epochs_tuned) {
    hb.max_resource(load_config(o.config_path, o.overrides).trainer.epochs());
  }
  try {
    return std::make_shared<tune::HyperbandPruner>(hb);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("{}: hyperband: {}", o.space_path, e.what()), "hyperband");
  }
}

std::string direction_of(const TuneJobOptions& o) {
  if (!o.direction.empty()) return o.direction;
  return o.metric.find("accuracy") != std::string::npos ? "maximize" : "minimize";
}

std::string shown_overrides(const tune::ParamSet& params, const char* before) {
  std::string shown;
  for (const auto& s : param_overrides(params)) shown += before + s;
  return shown;
}

std::string read_text(const fs::path& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(fmt::format("{}: cannot open", path.string()));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---- Outputs: trials.csv, best.toml, best_so_far.svg.

/// Where a study's outputs go: the study directory `out` for the study named after it, and `reports` (the
/// study's own directory under trials/) for another study sharing it.
struct OutputDirs {
  fs::path out;
  fs::path reports;
};

void write_outputs(const OutputDirs& dirs, const SearchSpace& space, const std::vector<TrialRecord>& records,
                   bool minimize, const std::string& metric) {
  const fs::path& out = dirs.out;
  std::string csv = "number,state," + metric;
  for (const auto& p : space.params()) csv += fmt::format(",{}", p.name);
  csv += ",seconds,dir\n";
  std::vector<double> xs, best_so_far;
  double best = NAN;
  const TrialRecord* best_record = nullptr;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    csv += fmt::format("{},{},{}", r.trial.number, tune::to_string(r.trial.state),
                       r.trial.state == TrialState::Complete ? fmt::format("{}", r.trial.value) : "");
    for (const auto& p : space.params()) csv += fmt::format(",{}", tune::to_string(r.trial.params.at(p.name)));
    csv += fmt::format(",{:.1f},{}\n", r.seconds, r.dir);
    if (r.trial.state == TrialState::Complete &&
        (std::isnan(best) || (minimize ? r.trial.value < best : r.trial.value > best))) {
      best = r.trial.value;
      best_record = &r;
    }
    if (!std::isnan(best)) {
      xs.push_back(static_cast<double>(i + 1));
      best_so_far.push_back(best);
    }
  }
  fs::create_directories(dirs.reports);
  train::write_file_atomic((dirs.reports / "trials.csv").string(), csv);
  if (best_record) {
    // A trial that Python Optuna ran has no run directory here.
    const fs::path cfg = best_record->dir.empty() ? fs::path() : out / best_record->dir / "config.toml";
    std::string text = fmt::format("# The best trial of the study in {}: trial {}, {} = {}\n# Tuned:",
                                   (dirs.reports == out ? out : dirs.reports).string(), best_record->trial.number,
                                   metric, best_record->trial.value);
    text += shown_overrides(best_record->trial.params, " --set ") + "\n";
    if (!cfg.empty() && fs::exists(cfg)) text += read_text(cfg);
    train::write_file_atomic((dirs.reports / "best.toml").string(), text);
  }
  log::SvgPlot plot(log::PlotOptions().title("trainkit tune: best " + metric + " so far").x_label("finished trials")
                        .y_label(metric));
  plot.add_series({"best so far", xs, best_so_far, true});
  plot.save((dirs.reports / "best_so_far.svg").string());
}

// ---- Trials as child processes.

/// A trial being run: its `trainkit train` process and run directory (relative to the study directory).
struct RunningTrial {
  Trial trial;
  std::string dir;
  Subprocess process;
  Clock::time_point start;
  bool pruned = false;
};

/// Runs trials as child processes `trainkit train --config BASE --set ... --out OUT/trials/<study>/trial-NNNN`
/// (output to train.log there) and watches them; a killed study takes its trials along.
class TrialRunner {
 public:
  TrialRunner(const TuneJobOptions& o, fs::path out)
      : o_(o), out_(std::move(out)), exe_(o.executable.empty() ? fs::read_symlink("/proc/self/exe").string() : o.executable) {
    fs::create_directories(out_ / "trials");
  }

  size_t size() const { return running_.size(); }

  /// Starts trial `t` in `dir` (the study's own, created for it by StudyJournal::ask) with
  /// `overrides` (the study's --set, then the trial's parameters: what the journal records for it).
  void start(const Trial& t, const std::string& dir, const std::vector<std::string>& overrides) {
    // `dir` was created for this trial alone when the journal numbered it (StudyJournal::ask): nothing of
    // another study or trial is in it to remove.
    fs::create_directories(out_ / dir);
    std::vector<std::string> args = {exe_, "train", "--config", o_.config_path, "--out", (out_ / dir).string()};
    for (const auto& s : overrides) args.insert(args.end(), {"--set", s});
    Subprocess process(
        SubprocessOptions().argv(args).log_file((out_ / dir / "train.log").string()).parent_death_signal(SIGTERM));
    spdlog::info("tune: trial {} started:{}", t.number, shown_overrides(t.params, " "));
    running_.push_back({t, dir, std::move(process), Clock::now()});
  }

  /// Reports the running trials' new per-epoch values to the study's pruner (with `prune`) and stops those
  /// it prunes (SIGTERM); returns the trials whose process has ended, their exit status in `process`.
  std::vector<RunningTrial> poll(StudyJournal& study, bool prune) {
    std::vector<RunningTrial> ended;
    for (auto it = running_.begin(); it != running_.end();) {
      if (it->process.poll()) {
        ended.push_back(std::move(*it));
        it = running_.erase(it);
        continue;
      }
      if (prune && !it->pruned) check_pruned(study, *it);
      ++it;
    }
    return ended;
  }

 private:
  void check_pruned(StudyJournal& study, RunningTrial& r) const {
    for (const auto& [epoch, value] : val_history(out_ / r.dir, o_.metric)) {
      if (study.reported(r.trial.number, epoch)) continue;
      if (study.report(r.trial.number, epoch, value)) {
        spdlog::info("tune: trial {} pruned at epoch {} ({} {})", r.trial.number, epoch, o_.metric, value);
        r.pruned = true;
        r.process.kill(SIGTERM);
        return;
      }
    }
  }

  const TuneJobOptions& o_;
  fs::path out_;
  std::string exe_;
  std::vector<RunningTrial> running_;
};

/// Tells the study how an ended trial went (its epochs not yet reported, then pruned, its objective, or
/// failed). A trial that `trainkit train` rejected as a configuration error (exit code 2) ends failed and
/// uncounted: a corrected config runs it again.
void finish_trial(StudyJournal& study, const RunningTrial& r, const TuneJobOptions& o, const fs::path& out) {
  const int code = r.process.status()->shell_code();
  // Epochs the watcher had not read before the process ended are judged as they would have been while it ran: a
  // trial that ended normally is pruned at the first of them its pruner stops (as Optuna's report-then-
  // should_prune loop prunes at the last epoch too), so a trial's state does not depend on the polling's timing.
  bool pruned = r.pruned;
  for (const auto& [epoch, value] : val_history(out / r.dir, o.metric)) {
    if (study.reported(r.trial.number, epoch)) continue;
    if (study.report(r.trial.number, epoch, value) && !pruned && code == 0) {
      spdlog::info("tune: trial {} pruned at epoch {} ({} {})", r.trial.number, epoch, o.metric, value);
      pruned = true;
      break;
    }
  }
  if (pruned) {
    study.finish(r.trial.number, OptunaTrialState::Pruned, NAN);
  } else if (code == 0) {
    double value = NAN;
    try {
      value = run_objective(out / r.dir, o.metric);
    } catch (const std::exception& e) {
      spdlog::warn("tune: trial {}: {}", r.trial.number, e.what());
    }
    if (std::isnan(value)) spdlog::warn("tune: trial {}: no finite {} in {}", r.trial.number, o.metric, r.dir);
    study.finish(r.trial.number, OptunaTrialState::Complete, value);
  } else if (code == kExitUsage) {
    study.finish(r.trial.number, OptunaTrialState::Fail, NAN, "trainkit train rejected its configuration");
  } else {
    spdlog::warn("tune: trial {} failed (exit code {}); see {}", r.trial.number, code,
                 (out / r.dir / "train.log").string());
    study.finish(r.trial.number, OptunaTrialState::Fail, NAN);
  }
}

/// The name of the study directory's own study: the directory's name.
std::string default_study_name(const TuneJobOptions& o) {
  const fs::path dir = fs::weakly_canonical(fs::absolute(o.out_dir));
  return dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
}

/// The study's name in the journal: --study-name, else the study directory's name.
std::string study_name_of(const TuneJobOptions& o) {
  return o.study_name.empty() ? default_study_name(o) : o.study_name;
}

}  // namespace

TuneJobResult run_tune_job(const TuneJobOptions& o) {
  check_options(o);
  const std::string direction = direction_of(o);
  const SearchSpace space = load_search_space(o.space_path);
  check_space_against_config(space, o.space_path, o.config_path, o.overrides);

  const fs::path out(o.out_dir);
  fs::create_directories(out);
  const fs::path journal_path = out / "study.journal", old_path = out / "study.jsonl";
  // An older trainkit's study.jsonl is read once (and checked like the journal) into a new journal; it is left
  // in place, unread from then on.
  std::optional<std::vector<TrialRecord>> old_study;
  if (!fs::exists(journal_path) && fs::exists(old_path)) {
    old_study = read_study_file(old_path, space, {space.fingerprint(), o.metric, direction, o.seed}, o.space_path);
  }
  const TuneChoices choices = load_tune_choices(o.space_path);
  const auto pruner = make_pruner(o, choices, space, study_name_of(o));
  const auto sampler = make_sampler(o, choices);
  const auto options = tune::StudyOptions().direction(direction).seed(o.seed);
  StudyJournal study(journal_path, space, {study_name_of(o), o.metric, direction, o.space_path},
                     [&] { return tune::Study(space, sampler, options, pruner); });
  if (old_study && !study.continued()) {
    study.import(*old_study);
    spdlog::info("tune: read {} trials of {} into {}", old_study->size(), old_path.string(),
                 journal_path.string());
  }
  if (study.continued() || old_study) {
    spdlog::info("tune: continuing the study in {} ({} trials)", journal_path.string(), study.counted());
  }

  const auto trial_overrides = [&](const Trial& t) {
    std::vector<std::string> all = o.overrides;
    for (const auto& s : param_overrides(t.params)) all.push_back(s);
    return all;
  };
  // The study named after --out writes its outputs there; another study sharing --out writes them beside its
  // trials, so that studies do not overwrite each other's trials.csv, best.toml and best_so_far.svg.
  const std::string name = study_name_of(o);
  const OutputDirs outputs{out, name == default_study_name(o) ? out : out / "trials" / study_dir_name(name)};
  TrialRunner runner(o, out);
  std::string config_failure;  // a trial's configuration was rejected: start no more, then stop
  bool full = false;           // the study holds --trials trials (all workers')
  while (true) {
    while (config_failure.empty() && !full && static_cast<int64_t>(runner.size()) < o.jobs) {
      const auto asked = study.ask(o.trials, trial_overrides);
      if (!asked) {
        full = true;
        break;
      }
      runner.start(asked->trial, asked->dir, trial_overrides(asked->trial));
    }
    if (runner.size() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    study.refresh();
    for (const RunningTrial& r : runner.poll(study, pruner != nullptr)) {
      finish_trial(study, r, o, out);
      if (!r.pruned && r.process.status()->shell_code() == kExitUsage) {
        if (config_failure.empty()) {
          config_failure = fmt::format("tune: trial {}: trainkit train rejected its configuration (exit code 2); "
                                       "see {}", r.trial.number, (out / r.dir / "train.log").string());
        }
        continue;
      }
      const auto records = study.records();
      for (const auto& rec : records) {
        if (rec.trial.number != r.trial.number) continue;
        spdlog::info("tune: trial {} {}: {} = {} ({:.1f} s); {} of {} finished", rec.trial.number,
                     tune::to_string(rec.trial.state), o.metric, rec.trial.value, rec.seconds, records.size(), o.trials);
      }
      write_outputs(outputs, space, records, options.direction() == "minimize", o.metric);
    }
  }
  if (!config_failure.empty()) throw UsageError(config_failure);

  study.refresh();
  const auto records = study.records();
  const bool minimize = direction == "minimize";
  if (!records.empty()) write_outputs(outputs, space, records, minimize, o.metric);
  TuneJobResult result;
  for (const auto& r : records) {
    result.trials.push_back(r.trial);
    if (r.trial.state == TrialState::Complete &&
        (!result.best || (minimize ? r.trial.value < result.best->value : r.trial.value > result.best->value))) {
      result.best = r.trial;
    }
  }
  if (result.best) {
    spdlog::info("tune: best trial {}: {} = {}; {}/best.toml;{}", result.best->number, o.metric, result.best->value,
                 out.string(), shown_overrides(result.best->params, " --set "));
  }
  return result;
}

}  // namespace trainkit::app
