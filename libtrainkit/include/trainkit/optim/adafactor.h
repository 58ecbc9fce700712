#pragma once
/// @file
/// Adafactor, adaptive learning rates with sublinear memory cost (Shazeer & Stern 2018, arXiv 1804.04235),
/// with timm's semantics and defaults (timm.optim.Adafactor): a factored second moment for matrices, update
/// clipping by RMS, and a relative step size when no learning rate is given. ATen reference path only.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/optimizer_base.h"
#include "trainkit/optim/optimizer_options.h"

namespace trainkit::optim {

/// Options of Adafactor (timm's names and defaults; timm's constructor takes beta1 as `betas=(beta1, _)`).
struct AdafactorOptions : public OptimizerOptions<AdafactorOptions> {
  AdafactorOptions() = default;
  /// Options with the external learning rate `lr`.
  AdafactorOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor)
  /// External learning rate (> 0); unset (0 in a config) = relative step: each parameter's step size is
  /// min(warmup_init ? 1e-6·t : 1e-2, 1/√t), times max(eps_scale, RMS(p)) when scale_parameter.
  TORCH_ARG(std::optional<double>, lr) = std::nullopt;
  /// Added to g² (>= 0).
  TORCH_ARG(double, eps) = 1e-30;
  /// Lower bound of the parameter scale of the relative step (>= 0).
  TORCH_ARG(double, eps_scale) = 1e-3;
  /// The update is divided by max(1, RMS(update) / clip_threshold) (> 0).
  TORCH_ARG(double, clip_threshold) = 1.0;
  /// The second moment's averaging coefficient at step t is β2_t = 1 - t^decay_rate (<= 0).
  TORCH_ARG(double, decay_rate) = -0.8;
  /// First moment: m ← lerp(m, update, 1 - beta1) is applied instead of the update, in [0, 1); unset = none.
  TORCH_ARG(std::optional<double>, beta1) = std::nullopt;
  /// Weight decay (>= 0): p ← p - weight_decay·lr_t·p, lr_t the step's learning rate.
  TORCH_ARG(double, weight_decay) = 0.0;
  /// Scale the relative step by the parameter's RMS (relative step only, as in timm).
  TORCH_ARG(bool, scale_parameter) = true;
  /// Relative step warm-up: min(1e-6·t, 1/√t) instead of min(1e-2, 1/√t) (relative step only).
  TORCH_ARG(bool, warmup_init) = false;
  /// The second moment of a parameter is factored (row and column averages) when two of its dimensions
  /// are larger than this: dims 0 and 1 of a tensor with more than 2 dims (convolutions), else its last two.
  TORCH_ARG(int64_t, min_dim_size_to_factor) = 16;

 public:
  /// The fields' keys, rules and help (the factory's "adafactor" arguments), checks and serialization.
  static const OptimizerOptionsBinding<AdafactorOptions>& binding() {
    static const auto b =
        OptimizerOptionsBinding<AdafactorOptions>()
            .bind(TRAINKIT_OPTION(lr), positive(), "External learning rate (unset: relative step)")
            .bind(TRAINKIT_OPTION(eps), non_negative(), "Term added to g^2")
            .bind(TRAINKIT_OPTION(eps_scale), non_negative(), "Lower bound of the relative step's parameter scale")
            .bind(TRAINKIT_OPTION(clip_threshold), positive(), "Update divided by max(1, RMS(update) / clip_threshold)")
            .bind(TRAINKIT_OPTION(decay_rate), NumberRule{"number <= 0", -std::numeric_limits<double>::infinity(),
                                                          false, 0.0, false},
                  "Second-moment coefficient at step t: 1 - t^decay_rate")
            .bind(TRAINKIT_OPTION(beta1), unit_interval(), "First-moment coefficient (unset: no first moment)")
            .bind(TRAINKIT_OPTION(weight_decay), non_negative(), "Weight decay: p <- p - wd lr_t p")
            .bind(TRAINKIT_OPTION(scale_parameter), "Relative step scaled by max(eps_scale, RMS(p))")
            .bind(TRAINKIT_OPTION(warmup_init), "Relative step min(1e-6 t, 1/sqrt(t)) instead of min(1e-2, 1/sqrt(t))")
            .bind(TRAINKIT_OPTION(min_dim_size_to_factor), rule::integer(0),
                  "Factor the second moment of tensors with two dims larger than this")
            .require([](const AdafactorOptions& o) -> std::string {
              return o.warmup_init() && o.lr().has_value() ? "warmup_init requires the relative step (lr unset)" : "";
            });
    return b;
  }
  /// The external lr; with the relative step, the step size of the group's last parameter in the last step
  /// (0 before the first), as timm's param_group['lr'].
  double get_lr() const override { return lr_.value_or(relative_lr_); }
  /// Sets the external lr; with the relative step, what get_lr returns until the next step recomputes it
  /// (as timm overwrites param_group['lr']): schedulers do not drive a relative-step Adafactor.
  void set_lr(double lr) override {
    if (lr_.has_value()) {
      lr_ = lr;
    } else {
      relative_lr_ = lr;
    }
  }
  /// Records the relative step's last step size (Adafactor's step).
  void set_relative_lr(double lr) { relative_lr_ = lr; }

 private:
  double relative_lr_ = 0.0;
};

/// Per-parameter state of Adafactor (timm's state_dict names); a factored parameter has exp_avg_sq_row and
/// exp_avg_sq_col, another exp_avg_sq; exp_avg only with beta1. Kept in float32 for bfloat16/float16
/// parameters. timm's `RMS` entry is not kept: it is recomputed from the parameter at every step.
struct AdafactorParamState : public torch::optim::OptimizerCloneableParamState<AdafactorParamState> {
  /// Steps taken for this parameter.
  TORCH_ARG(int64_t, step) = 0;
  /// Running average of the clipped, scaled update (beta1 only).
  TORCH_ARG(at::Tensor, exp_avg);
  /// Running average of g² + eps (parameters that are not factored).
  TORCH_ARG(at::Tensor, exp_avg_sq);
  /// Its average over the row dimension (factored parameters).
  TORCH_ARG(at::Tensor, exp_avg_sq_row);
  /// Its average over the column dimension (factored parameters).
  TORCH_ARG(at::Tensor, exp_avg_sq_col);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Adafactor, per parameter at step t: v from g² + eps, β2_t = 1 - t^decay_rate (factored: row and column
/// averages, v̂ = row/mean(row) ⊗ col); u = g/√v̂;  u ← u / max(1, RMS(u)/clip_threshold);  u ← lr_t·u;
/// with beta1, m ← lerp(m, u, 1-beta1) and u = m;  p ← p - weight_decay·lr_t·p - u. The ATen reference
/// path (timm's implementation op for op, one host read per parameter for the relative step's RMS) on
/// every device; no fused kernel. Sparse gradients are rejected.
class Adafactor : public OptimizerBase<Adafactor, AdafactorOptions, AdafactorParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Adafactor";
  /// From params or param groups (which may carry their own AdafactorOptions).
  using OptimizerBase::OptimizerBase;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
};

/// Registers "adafactor" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_adafactor_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool adafactor_registered = register_adafactor_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
