#pragma once
/// @file
/// The search space of `trainkit tune` as config keys (application layer): read from a TOML file, turned
/// into `--set` overrides, and checked against a base config.
///
/// Search-space file (TOML): one table per tuned key, named by the config key:
/// ```
/// [optimizer.lr]
/// type = "float"        # float, int or categorical
/// low = 1e-4
/// high = 1e-2
/// log = true            # optional, default false
/// [optimizer.name]
/// type = "categorical"
/// choices = ["adam", "adamw"]
/// ```
/// Top-level keys beside the tables choose the sampler and the pruner, and their options (Optuna's names):
/// ```
/// sampler = "tpe"       # gp, tpe or random
/// pruner = "hyperband"  # none, median, successive_halving or hyperband
/// [tpe]
/// n_startup_trials = 10
/// [hyperband]
/// max_resource = "auto" # or an integer; auto: the config's epochs
/// ```

#include <string>
#include <vector>

#include "trainkit/tune/hyperband.h"
#include "trainkit/tune/search_space.h"
#include "trainkit/tune/tpe_sampler.h"

namespace trainkit::app {

/// Reads a search-space file. Throws ConfigError naming the file, the parameter and the problem (unknown
/// field, missing bound, empty range, log range with low <= 0, unknown type).
tune::SearchSpace load_search_space(const std::string& path);

/// The sampler, pruner and options a search-space file chooses (its keys sampler, pruner and tables tpe,
/// successive_halving, hyperband; none of them is a tuned key).
struct TuneChoices {
  std::string sampler;  ///< gp, tpe or random; empty: the file does not say
  std::string pruner;   ///< none, median, successive_halving or hyperband; empty: the file does not say
  /// `[tpe]`: n_startup_trials, n_ei_candidates, multivariate, constant_liar, prior_weight,
  /// consider_magic_clip, consider_endpoints
  tune::TPESamplerOptions tpe;
  bool tpe_startup_set = false;  ///< tpe.n_startup_trials was given (else --startup-trials applies)
  /// `[successive_halving]`: min_resource ("auto" or an integer), reduction_factor, min_early_stopping_rate,
  /// bootstrap_count
  tune::SuccessiveHalvingPrunerOptions successive_halving;
  /// `[hyperband]`: min_resource, max_resource ("auto" or an integer), reduction_factor, bootstrap_count
  tune::HyperbandPrunerOptions hyperband;
};

/// The choices of a search-space file. Throws ConfigError `PATH: KEY: ...` naming the key for an unknown
/// sampler, pruner or option, a value of the wrong type, or one the sampler or pruner rejects.
TuneChoices load_tune_choices(const std::string& path);

/// The `--set` overrides that give a config the values of `params`, in the params' order:
/// `optimizer.lr=0.001`, `model.hidden=64`, `optimizer.name="adam"` (choices quoted as TOML strings).
std::vector<std::string> param_overrides(const tune::ParamSet& params);

/// Checks before any trial runs that the config at `config_path` with `overrides` loads, and that it
/// accepts every parameter of `space` at both ends of its range, one parameter at a time. Throws the
/// base config's error as load_config does, or ConfigError `SPACE_PATH: NAME: not accepted by the config
/// at VALUE: REASON` naming the parameter.
void check_space_against_config(const tune::SearchSpace& space, const std::string& space_path,
                                const std::string& config_path, const std::vector<std::string>& overrides);

}  // namespace trainkit::app
