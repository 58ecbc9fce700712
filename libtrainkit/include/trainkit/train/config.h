#pragma once
/// @file
/// The TOML configuration of `trainkit train`: typed, validated, every key documented in one table.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}

namespace trainkit::train {

/// A configuration problem: unknown key, wrong type or out-of-range value. what() names the source
/// (file or `--set`), the key and what was expected. `trainkit` exits with code 2 on it.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// `[data]`: where the data set is and how it is split.
struct DataConfig {
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int64_t val_size = 5000;
  int64_t limit_train = 0;
  int64_t limit_test = 0;
};

/// `[model]`: the network trained.
struct ModelConfig {
  std::string name = "cnn";
  std::vector<int64_t> channels{32, 64};
  int64_t hidden = 128;
  double dropout = 0.25;
  bool batch_norm = true;
};

/// `[optimizer]`: PyTorch's argument names; unset arguments take the optimizer's own default.
struct OptimizerConfig {
  std::string name = "adam";
  std::optional<double> lr;
  std::optional<std::array<double, 2>> betas;
  std::optional<double> eps;
  std::optional<double> weight_decay;
  std::optional<bool> amsgrad;
  std::optional<double> momentum;
  std::optional<double> dampening;
  std::optional<bool> nesterov;
  std::optional<double> trust_coefficient;
  std::optional<bool> trust_clip;
  std::optional<bool> always_adapt;
  std::optional<bool> bias_correction;
  std::optional<bool> grad_averaging;
  std::optional<double> max_grad_norm;  ///< lamb: 0 = no global clip
  bool no_decay_1d = false;
};

/// `[train]`: the loop.
struct LoopConfig {
  int64_t epochs = 12;
  int64_t batch_size = 128;
  int64_t eval_batch_size = 1000;
  int64_t seed = 0;
  int64_t max_steps = 0;
  int64_t threads = 0;
  std::string device = "cpu";
};

/// `[grad]`: gradient clipping and accumulation.
struct GradConfig {
  int64_t accumulation_steps = 1;
  double clip_norm = 0.0;
  double norm_type = 2.0;
  double clip_value = 0.0;
};

/// `[amp]`: mixed precision.
struct AmpConfig {
  bool enabled = false;
  std::string dtype = "bfloat16";
  bool grad_scaler = false;
  double init_scale = 65536.0;
  int64_t growth_interval = 2000;
};

/// `[checkpoint]`: when checkpoints are written and how many are kept.
struct CheckpointConfig {
  int64_t every_steps = 0;
  int64_t keep_last = 3;
};

/// `[log]`: console and metrics files.
struct LogConfig {
  int64_t every_steps = 100;
  std::string progress = "auto";
  bool tensorboard = false;
};

/// `[distributed]`: used when the job runs under `trainkit launch` or torchrun (WORLD_SIZE > 1).
struct DistributedConfig {
  std::string backend = "auto";
  double timeout = 1800.0;
  double bucket_cap_mb = 25.0;
};

/// The whole configuration; default-constructed it is the documented defaults.
struct TrainConfig {
  DataConfig data;
  ModelConfig model;
  OptimizerConfig optimizer;
  LoopConfig train;
  GradConfig grad;
  AmpConfig amp;
  CheckpointConfig checkpoint;
  LogConfig log;
  DistributedConfig distributed;
  /// `[scheduler]`: the TOML text of the table (`type` plus PyTorch's argument names and `interval`),
  /// built by trainkit::sched::make_scheduler; empty = constant LR.
  std::string scheduler;
};

/// Parses `path` and then applies `overrides` (each `section.key=value`, value in TOML syntax or a
/// bare string), validating every key; fills unset optimizer arguments with the optimizer's defaults.
/// Throws ConfigError naming the file or override, the key and what was expected.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});

/// Same as load_config, from TOML text; `source` names it in errors.
TrainConfig parse_config(const std::string& toml_text, const std::string& source,
                         const std::vector<std::string>& overrides = {});

/// The configuration as TOML text that parse_config reads back to the same values.
std::string to_toml(const TrainConfig& config);

/// A Markdown table of every key: `key | type | default | meaning`.
std::string config_keys_markdown();

/// The optimizer a resolved `[optimizer]` table describes, over `params`: trainkit's own Adam, AdamW, Sgd,
/// Lars or Lamb (fused CPU kernels). With `no_decay_1d`, parameters with ndim <= 1 get their own group
/// with weight_decay 0 (and so no LARS/LAMB adaptation).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        const std::vector<at::Tensor>& params);

}  // namespace trainkit::train
