#pragma once
/// @file
/// LARS, layer-wise adaptive rate scaling (You et al. 2017, arXiv 1708.03888), with timm's semantics and
/// defaults (timm.optim.Lars; LARC clipping as NVIDIA apex), and a fused CPU path.

#include <optional>
#include <vector>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/cyclable_momentum.h"
#include "trainkit/optim/optimizer_base.h"
#include "trainkit/optim/sgd.h"

namespace trainkit::optim {

/// Options of Lars (timm's defaults; timm calls trust_coefficient `trust_coeff`).
struct LarsOptions : public OptimizerOptions<LarsOptions>, public CyclableMomentum {
  LarsOptions() = default;
  /// Options with learning rate `lr`.
  LarsOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor)
  /// Learning rate (>= 0).
  TORCH_ARG(double, lr) = 1.0;
  /// Momentum factor (>= 0).
  TORCH_ARG(double, momentum) = 0;
  /// Dampening of the momentum (>= 0).
  TORCH_ARG(double, dampening) = 0;
  /// Weight decay (>= 0), added to the gradient before the trust ratio scales it.
  TORCH_ARG(double, weight_decay) = 0;
  /// Nesterov momentum (needs momentum > 0 and dampening = 0).
  TORCH_ARG(bool, nesterov) = false;
  /// Trust coefficient η (> 0): ratio = η·‖w‖ / (‖g‖ + wd·‖w‖ + eps).
  TORCH_ARG(double, trust_coefficient) = 0.001;
  /// Added to the trust ratio's denominator (>= 0).
  TORCH_ARG(double, eps) = 1e-8;
  /// LARC: clip the ratio so that the effective LR never exceeds lr (ratio ← min(ratio / lr, 1)).
  TORCH_ARG(bool, trust_clip) = false;
  /// Adapt every parameter; by default only those with weight_decay ≠ 0 are adapted.
  TORCH_ARG(bool, always_adapt) = false;
  /// Kernel choice: unset = fused where possible, true = fused or throw, false = ATen reference path.
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;
  /// Multi-tensor ATen path (`_foreach_*` ops, as PyTorch's `foreach=True`): unset = on for tensors that
  /// are not on the CPU (CUDA), where the fused CPU kernel does not run; true = always (no fused kernel).
  TORCH_ARG(std::optional<bool>, foreach) = std::nullopt;

 public:
  /// The fields' keys, rules and help (the factory's "lars" arguments), checks and serialization.
  static const OptimizerOptionsBinding<LarsOptions>& binding() {
    static const auto b =
        bind_momentum_fields(OptimizerOptionsBinding<LarsOptions>(), "Weight decay, inside the adapted update")
            .bind(TRAINKIT_OPTION(trust_coefficient), positive(), "Trust coefficient (timm's trust_coeff)")
            .bind(TRAINKIT_OPTION(eps), non_negative(), "Term added to the trust ratio's denominator")
            .bind(TRAINKIT_OPTION(trust_clip), "LARC: clip the ratio so that the effective LR never exceeds lr")
            .bind(TRAINKIT_OPTION(always_adapt), "Adapt every parameter, also those with weight_decay 0")
            .bind(TRAINKIT_OPTION(fused), kFusedDoc)
            .bind(TRAINKIT_OPTION(foreach), kForeachDoc);
    return b;
  }
  double cycled_momentum() const override { return momentum_; }
  void set_cycled_momentum(double momentum) override { momentum_ = momentum; }
};

/// Lars keeps the same state as Sgd (the momentum buffer; both run detail::momentum_update), saved under
/// the same key ("momentum_buffer").
using LarsParamState = SgdParamState;

/// LARS: where weight_decay ≠ 0 (or always_adapt), d = ratio·(g + wd·p) with the trust ratio above (1 where
/// ‖w‖ or ‖g‖ is 0); then SGD momentum on d and p ← p - lr·d. Use weight_decay_param_groups() to keep
/// biases and norm weights (ndim ≤ 1) out of decay and adaptation.
class Lars : public OptimizerBase<Lars, LarsOptions, LarsParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Lars";
  /// From params or param groups (which may carry their own LarsOptions).
  using OptimizerBase::OptimizerBase;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
};

/// Registers "lars" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_lars_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool lars_registered = register_lars_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
