#pragma once
/// @file
/// `trainkit tune` (application layer): a hyperparameter study whose trials are `trainkit train` runs.
///
/// Each trial is a child process `trainkit train --config BASE --set key=value ... --out
/// OUT/trials/<study>/trial-NNNN` (each study of a shared OUT in its own directory); its objective is read
/// from the finished run (`val_*`: the last epoch row of metrics.jsonl; `test_*`: summary.json). Output
/// directory: `study.journal` (the study as an Optuna JournalStorage file, which Python Optuna,
/// optuna-dashboard and other `trainkit tune` processes read and extend at once: a re-run with the same --out
/// continues the study; see trainkit/tune/optuna_journal.h), `trials.csv`, `best.toml` (the best trial's
/// effective config), `best_so_far.svg` and `trials/`. A study not named after OUT (--study-name) that shares
/// it writes its `trials.csv`, `best.toml` and `best_so_far.svg` in `trials/<study>/` instead.
///
/// The search-space file and its checks against the base config: trainkit/app/search_space_file.h.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainkit/app/search_space_file.h"
#include "trainkit/tune/search_space.h"
#include "trainkit/tune/sampler.h"
#include "trainkit/tune/study.h"

namespace trainkit::app {

/// What `trainkit tune` was asked to do.
struct TuneJobOptions {
  std::string config_path;             ///< base TOML config of every trial
  std::vector<std::string> overrides;  ///< `--set` applied to every trial before the tuned keys
  std::string space_path;              ///< search-space TOML file
  std::string out_dir;                 ///< study directory
  int64_t trials = 20;                 ///< trials wanted in the study in total (all workers', earlier runs')
  int64_t jobs = 1;                    ///< trials run at once (child processes)
  std::string metric = "val_loss";     ///< objective: val_loss, val_<metric>, test_loss or test_<metric>
  std::string direction;               ///< minimize or maximize; empty: maximize for accuracy, else minimize
  /// gp (Bayesian, Gaussian process), tpe (Parzen estimators) or random; empty: the space file's `sampler`,
  /// else gp
  std::string sampler;
  /// gp, tpe: trials of the initial design (Sobol; tpe: random) before the model takes over (tpe: the space
  /// file's tpe.n_startup_trials first)
  int64_t startup_trials = tune::GPSamplerOptions().n_startup_trials();
  uint64_t seed = 0;                   ///< study seed
  /// median-stop trials from their per-epoch validation metric (the space file's `pruner` chooses others)
  bool prune = false;
  std::string study_name;              ///< the study's name in the journal; empty: the --out directory's name
  std::string executable;              ///< the trainkit program that runs `train` (the CLI passes itself)
};

/// Result of a study run.
struct TuneJobResult {
  std::vector<tune::Trial> trials;  ///< all finished trials (earlier runs' included)
  std::optional<tune::Trial> best;  ///< the best completed one
};

/// Runs (or continues) the study. Checks the space against the base config (every tuned key at both ends
/// of its range must be accepted by `trainkit train`) and the study file against the space before any trial
/// starts; throws ConfigError / UsageError then. A trial whose training fails or whose objective is NaN is
/// recorded as failed; a trial that fails on a configuration error (exit code 2) stops the study, keeping
/// every trial finished before it.
TuneJobResult run_tune_job(const TuneJobOptions& options);

}  // namespace trainkit::app
