#pragma once
/// @file
/// Successive halving (asynchronous, ASHA: Li et al. 2020, arXiv 1810.05934) and Hyperband (Li et al. 2018,
/// JMLR 18(185)) pruners with Optuna 5.1's rules and defaults (SuccessiveHalvingPruner, HyperbandPruner).
///
/// A trial's rungs: rung k is reached at step min_resource * reduction_factor^(min_early_stopping_rate + k); its
/// value there is the value reported at the first step at or after it. A trial that reaches a rung goes on only
/// when its value is among the best 1/reduction_factor of the values that the study's trials recorded at that
/// rung (the best one while fewer than reduction_factor have). Optuna keeps each trial's rung values as system
/// attributes (`completed_rung_k`) written when the pruner is asked; trainkit's pruners hold no state and derive
/// them from the reported values, which is the same when the pruner is asked at every report, at increasing
/// steps (as tune::Study::report and `trainkit tune` do).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "trainkit/tune/pruner.h"

namespace trainkit::tune {

/// Options of SuccessiveHalvingPruner (Optuna's names and defaults).
struct SuccessiveHalvingPrunerOptions {
  /// Steps before the first rung; empty ("auto"): the longest completed trial's last step / 100 (at least
  /// 1), no pruning before a trial completed.
  TORCH_ARG(std::optional<int64_t>, min_resource) = std::nullopt;
  /// eta: the rungs' spacing (each at reduction_factor times the steps of the one before) and the share that
  /// goes on (1 / reduction_factor).
  TORCH_ARG(int64_t, reduction_factor) = 4;
  /// s: the first rung is at min_resource * reduction_factor^s.
  TORCH_ARG(int64_t, min_early_stopping_rate) = 0;
  /// Trials that must have reached a rung before any trial is promoted past it (needs a min_resource).
  TORCH_ARG(int64_t, bootstrap_count) = 0;
};

/// Asynchronous successive halving, Optuna's SuccessiveHalvingPruner. Differences from Optuna: rung values are
/// derived from the reports (see above); with min_resource "auto" the estimate is made from the trials at each
/// call (Optuna makes it once, at the first call after a trial completed, and records no rung before it).
class SuccessiveHalvingPruner : public Pruner {
 public:
  explicit SuccessiveHalvingPruner(SuccessiveHalvingPrunerOptions options = {});
  bool should_prune(const std::vector<Trial>& trials, const Trial& trial, int64_t step, bool minimize) const override;
  const SuccessiveHalvingPrunerOptions& options() const { return options_; }

 private:
  SuccessiveHalvingPrunerOptions options_;
};

/// Options of HyperbandPruner (Optuna's names and defaults).
struct HyperbandPrunerOptions {
  /// Steps before the first rung of the most aggressive bracket.
  TORCH_ARG(int64_t, min_resource) = 1;
  /// Steps of a whole trial; empty ("auto"): the longest completed trial's last step + 1, no pruning before a
  /// trial completed.
  TORCH_ARG(std::optional<int64_t>, max_resource) = std::nullopt;
  /// eta, of every bracket's successive halving.
  TORCH_ARG(int64_t, reduction_factor) = 3;
  /// Of every bracket's successive halving (needs a max_resource).
  TORCH_ARG(int64_t, bootstrap_count) = 0;
  /// The study's name, which Optuna hashes with a trial's number to choose its bracket: give
  /// StudyOptions::study_name to get Optuna's brackets (`trainkit tune` does).
  TORCH_ARG(std::string, study_name) = "";
};

/// Hyperband, Optuna's HyperbandPruner: floor(log_eta(max_resource / min_resource)) + 1 brackets, bracket b a
/// successive halving with min_early_stopping_rate b over the trials of that bracket only. A trial's bracket:
/// crc32("<study_name>_<number>") modulo the total budget, the budgets ceil(n_brackets * eta^s / (s + 1)) for
/// s = n_brackets - 1 - b taken in bracket order, as Optuna does (so the same trial lands in the same bracket).
/// Differences from Optuna: as SuccessiveHalvingPruner's; max_resource "auto" is estimated at each call.
class HyperbandPruner : public Pruner {
 public:
  explicit HyperbandPruner(HyperbandPrunerOptions options = {});
  bool should_prune(const std::vector<Trial>& trials, const Trial& trial, int64_t step, bool minimize) const override;
  const HyperbandPrunerOptions& options() const { return options_; }
  /// The number of brackets for `max_resource`.
  int64_t n_brackets(int64_t max_resource) const;
  /// The bracket of trial `number` for `max_resource`.
  int64_t bracket(int64_t number, int64_t max_resource) const;

 private:
  HyperbandPrunerOptions options_;
};

/// CRC-32 (zlib's, ISO-HDLC) of `text`: what Optuna's Hyperband hashes with binascii.crc32.
uint32_t crc32(const std::string& text);

}  // namespace trainkit::tune
