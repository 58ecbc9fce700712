#pragma once
/// @file
/// LAMB, layer-wise adaptive moments (You et al. 2019, arXiv 1904.00962), with timm's semantics and defaults
/// (timm.optim.Lamb), and a fused CPU path.

#include <optional>
#include <tuple>
#include <vector>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/cyclable_momentum.h"
#include "trainkit/optim/optimizer_base.h"
#include "trainkit/optim/optimizer_options.h"

namespace trainkit::optim {

/// Options of Lamb (timm's names and defaults).
struct LambOptions : public OptimizerOptions<LambOptions>, public CyclableMomentum {
  using betas_t = std::tuple<double, double>;
  LambOptions() = default;
  /// Options with learning rate `lr`.
  LambOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor)
  /// Learning rate (>= 0).
  TORCH_ARG(double, lr) = 1e-3;
  /// Divide the moments by (1 - β^t) as Adam does.
  TORCH_ARG(bool, bias_correction) = true;
  /// Coefficients (β1, β2), each in [0, 1).
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the denominator (>= 0).
  TORCH_ARG(double, eps) = 1e-6;
  /// Weight decay added to the update (>= 0): u = m̂/(√v̂ + eps) + wd·p.
  TORCH_ARG(double, weight_decay) = 0.01;
  /// m ← β1·m + (1-β1)·g when true, m ← β1·m + g when false.
  TORCH_ARG(bool, grad_averaging) = true;
  /// Global gradient-norm clip over all groups before the step (> 0; unset or 0 = none). As in timm, the
  /// value of the optimizer's defaults applies; per-group values are ignored.
  TORCH_ARG(std::optional<double>, max_grad_norm) = 1.0;
  /// Clip the trust ratio at 1 (LAMBC).
  TORCH_ARG(bool, trust_clip) = false;
  /// Adapt every parameter; by default only those with weight_decay ≠ 0 are adapted.
  TORCH_ARG(bool, always_adapt) = false;
  /// Kernel choice: unset = fused where possible, true = fused or throw, false = ATen reference path.
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;
  /// Multi-tensor ATen path (`_foreach_*` ops, as PyTorch's `foreach=True`): unset = on for tensors that
  /// are not on the CPU (CUDA), where the fused CPU kernel does not run; true = always (no fused kernel).
  TORCH_ARG(std::optional<bool>, foreach) = std::nullopt;

 public:
  /// The fields' keys, rules and help (the factory's "lamb" arguments), checks and serialization.
  static const OptimizerOptionsBinding<LambOptions>& binding() {
    static const auto b =
        OptimizerOptionsBinding<LambOptions>()
            .bind(TRAINKIT_OPTION(lr), non_negative(), "Learning rate")
            .bind(TRAINKIT_OPTION(betas), unit_interval(), "(beta1, beta2): running-average coefficients of g and g^2")
            .bind(TRAINKIT_OPTION(eps), non_negative(), "Term added to the denominator")
            .bind(TRAINKIT_OPTION(weight_decay), non_negative(), "Weight decay, inside the adapted update")
            .bind(TRAINKIT_OPTION(bias_correction), "Adam's bias correction of the moments")
            .bind(TRAINKIT_OPTION(grad_averaging), "m = b1 m + (1-b1) g (false: m = b1 m + g)")
            .bind(TRAINKIT_OPTION(max_grad_norm), positive(), "Global gradient-norm clip before the step (unset: none)")
            .bind(TRAINKIT_OPTION(trust_clip), "Clip the trust ratio at 1 (LAMBC)")
            .bind(TRAINKIT_OPTION(always_adapt), "Adapt every parameter, also those with weight_decay 0")
            .bind(TRAINKIT_OPTION(fused), kFusedDoc)
            .bind(TRAINKIT_OPTION(foreach), kForeachDoc);
    return b;
  }
  double cycled_momentum() const override { return std::get<0>(betas_); }
  void set_cycled_momentum(double momentum) override { std::get<0>(betas_) = momentum; }
};

/// Per-parameter state of Lamb.
struct LambParamState : public torch::optim::OptimizerCloneableParamState<LambParamState> {
  /// Running average of the gradient.
  TORCH_ARG(at::Tensor, exp_avg);
  /// Running average of the squared gradient.
  TORCH_ARG(at::Tensor, exp_avg_sq);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// LAMB: gradients divided by max(‖g‖_global / max_grad_norm, 1); Adam moments; u = m̂/(√v̂ + eps) + wd·p;
/// where weight_decay ≠ 0 (or always_adapt) the step is scaled by the trust ratio ‖w‖/‖u‖ (1 where either
/// is 0); p ← p - lr·ratio·u. The step count is kept per param group, as timm does.
class Lamb : public OptimizerBase<Lamb, LambOptions, LambParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Lamb";
  /// From params or param groups (which may carry their own LambOptions).
  using OptimizerBase::OptimizerBase;

  /// Steps taken by each param group.
  const std::vector<int64_t>& group_steps() const { return group_steps_; }

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
  void save_extra(torch::serialize::OutputArchive& archive) const;
  void load_extra(torch::serialize::InputArchive& archive);
  std::vector<int64_t> group_steps_;
};

/// Registers "lamb" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_lamb_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool lamb_registered = register_lamb_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
