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

#include <string>
#include <vector>

#include "trainkit/tune/search_space.h"

namespace trainkit::app {

/// Reads a search-space file. Throws ConfigError naming the file, the parameter and the problem (unknown
/// field, missing bound, empty range, log range with low <= 0, unknown type).
tune::SearchSpace load_search_space(const std::string& path);

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
