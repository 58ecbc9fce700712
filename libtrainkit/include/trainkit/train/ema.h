#pragma once
/// @file
/// An exponential moving average of a model's weights with timm's `ModelEmaV3` semantics, and the helpers
/// every weight average shares (the tensors averaged, swapping them into a module, saving them). Usable in
/// a hand-written loop; the Trainer hook over it is callbacks/ema_weight_averaging.h.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "trainkit/options.h"

namespace trainkit::train {

/// The parameters then the buffers of `module` (recursively, in registration order), detached: the
/// tensors an averaged copy of the weights mirrors.
std::vector<at::Tensor> weight_tensors(const torch::nn::Module& module);

/// Loads `values` (as weight_tensors() orders them) into a module for a scope and restores its own weights,
/// bit for bit, when the scope ends: how averaged weights are evaluated with the model's own forward.
class ScopedWeights {
 public:
  ScopedWeights(torch::nn::Module& module, const std::vector<at::Tensor>& values);
  ~ScopedWeights();
  ScopedWeights(const ScopedWeights&) = delete;
  ScopedWeights& operator=(const ScopedWeights&) = delete;

 private:
  std::vector<at::Tensor> targets_;
  std::vector<at::Tensor> saved_;
};

/// Options of ModelEma; names and defaults are timm's `ModelEmaV3`.
struct ModelEmaOptions {
  ModelEmaOptions() = default;
  explicit ModelEmaOptions(double decay) : decay_(decay) {}
  /// Decay of the average (in [0, 1]); the upper bound of the warmup's decay.
  TORCH_ARG(double, decay) = 0.9999;
  /// Lower bound of the warmup's decay.
  TORCH_ARG(double, min_decay) = 0.0;
  /// Steps before averaging starts (the average is a copy until then).
  TORCH_ARG(int64_t, update_after_step) = 0;
  /// Warm the decay up: decay_t = clamp(1 - (1 + t / warmup_gamma)^-warmup_power, min_decay, decay).
  TORCH_ARG(bool, use_warmup) = false;
  /// See use_warmup (> 0).
  TORCH_ARG(double, warmup_gamma) = 1.0;
  /// See use_warmup.
  TORCH_ARG(double, warmup_power) = 2.0 / 3.0;
  /// Copy the buffers instead of averaging the floating-point ones.
  TORCH_ARG(bool, exclude_buffers) = false;

 public:
  /// The options by key, with their rules and help (`trainkit train`'s [ema]).
  static const OptionBinding<ModelEmaOptions>& binding() {
    static const auto b =
        OptionBinding<ModelEmaOptions>()
            .bind(TRAINKIT_OPTION(decay), rule::number(closed_unit_interval()), "EMA decay (the warmup's upper bound)")
            .bind(TRAINKIT_OPTION(min_decay), rule::number(closed_unit_interval()), "Lower bound of the warmup's decay")
            .bind(TRAINKIT_OPTION(update_after_step), rule::integer(0),
                  "Steps during which the EMA is a copy of the weights")
            .bind(TRAINKIT_OPTION(use_warmup), rule::boolean(),
                  "Warm the decay up: 1 - (1 + t / warmup_gamma)^-warmup_power, clamped to [min_decay, decay]")
            .bind(TRAINKIT_OPTION(warmup_gamma), rule::number(positive()), "See use_warmup")
            .bind(TRAINKIT_OPTION(warmup_power), rule::number(positive()), "See use_warmup")
            .bind(TRAINKIT_OPTION(exclude_buffers), rule::boolean(),
                  "Copy buffers (BatchNorm statistics) instead of averaging them");
    return b;
  }
};

/// timm's ModelEmaV3: ema ← lerp(ema, model, 1 - decay) for floating-point parameters and buffers
/// (buffers copied when exclude_buffers), other tensors copied. With a step (optimizer steps taken,
/// this one included, as timm's train.py passes it), decay = 0 (a copy) while
/// t = step - update_after_step - 1 <= 0, else `decay` or the warmup's decay. The average starts as a copy
/// of the model at construction; it has the model's devices and dtypes.
class ModelEma {
 public:
  /// Throws std::invalid_argument naming the bad option.
  ModelEma(const torch::nn::Module& model, ModelEmaOptions options = {});
  /// The decay used for `step` (`decay` when there is none).
  double get_decay(std::optional<int64_t> step = std::nullopt) const;
  /// One averaging step towards `model` (the module the average was made from).
  void update(const torch::nn::Module& model, std::optional<int64_t> step = std::nullopt);
  /// Sets the average to a copy of `model`.
  void set(const torch::nn::Module& model);
  /// The averaged parameters then buffers (see weight_tensors()).
  const std::vector<at::Tensor>& values() const { return values_; }
  const ModelEmaOptions& options() const { return options_; }
  /// Writes the averaged tensors.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Restores save()'s tensors in place; throws std::invalid_argument when they do not fit the model.
  void load(torch::serialize::InputArchive& archive);

 private:
  ModelEmaOptions options_;
  std::vector<at::Tensor> values_;
  size_t num_params_ = 0;
};

/// Saves `values` under "count" and "tensor/<i>"; shared by the averaging components.
void save_tensors(torch::serialize::OutputArchive& archive, const std::vector<at::Tensor>& values);
/// Copies what save_tensors() wrote into `values` in place; throws std::invalid_argument naming `who`
/// when count or shapes differ.
void load_tensors(torch::serialize::InputArchive& archive, std::vector<at::Tensor>& values, const std::string& who);

}  // namespace trainkit::train
