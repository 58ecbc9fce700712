#pragma once
/// @file
/// NAdam, Adam with Nesterov momentum (Dozat 2016, "Incorporating Nesterov Momentum into Adam", ICLR 2016
/// workshop), with PyTorch's names, defaults and semantics (torch.optim.NAdam: momentum_decay's schedule,
/// decoupled_weight_decay) and a fused CPU kernel.

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/moment_fields.h"
#include "trainkit/optim/optimizer_base.h"

namespace trainkit::optim {

/// Options of NAdam (PyTorch's names and defaults). Also the options of one param group.
struct NAdamOptions : public MomentFields<NAdamOptions> {
  /// Default learning rate.
  static constexpr double kLr = 2e-3;
  NAdamOptions() = default;
  /// Options with learning rate `lr`.
  NAdamOptions(double lr) : MomentFields(lr) {}  // NOLINT(google-explicit-constructor)
  /// ψ of the momentum schedule μt = β1·(1 - ½·0.96^(t·ψ)) (>= 0).
  TORCH_ARG(double, momentum_decay) = 4e-3;
  /// Decay the parameters, p ← p·(1 - lr·weight_decay) (NAdamW), instead of adding the L2 penalty
  /// weight_decay·p to the gradient.
  TORCH_ARG(bool, decoupled_weight_decay) = false;

 public:
  /// The fields' keys, rules and help (the factory's "nadam" arguments), checks and serialization.
  static const OptimizerOptionsBinding<NAdamOptions>& binding() {
    static const auto b = moment_binding([](auto& own) {
      own.bind(TRAINKIT_OPTION(momentum_decay), non_negative(), "psi of the momentum schedule b1 (1 - 0.96^(t psi) / 2)")
          .bind(TRAINKIT_OPTION(decoupled_weight_decay), "Decoupled weight decay p <- p (1 - lr wd) (NAdamW)");
    });
    return b;
  }
};

/// Per-parameter state of NAdam (torch.optim.NAdam's names).
struct NAdamParamState : public torch::optim::OptimizerCloneableParamState<NAdamParamState> {
  /// Steps taken.
  TORCH_ARG(int64_t, step) = 0;
  /// Running average of the gradient.
  TORCH_ARG(at::Tensor, exp_avg);
  /// Running average of the squared gradient.
  TORCH_ARG(at::Tensor, exp_avg_sq);
  /// μ1·μ2·…·μt: a 0-dim CPU tensor of the default dtype's precision (float64 when the default dtype is
  /// float64, else float32), as PyTorch keeps it, so that trajectories match PyTorch's to the last bits.
  TORCH_ARG(at::Tensor, mu_product);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// NAdam: Adam's moments; μt = β1·(1 - ½·0.96^(t·ψ)), Πt = μ1⋯μt, d = √(v/(1-β2^t)) + eps;
///   p ← p - lr·(1-μt)/(1-Πt)·g/d - lr·μ(t+1)/(1-Πt·μ(t+1))·m/d.
class NAdam : public OptimizerBase<NAdam, NAdamOptions, NAdamParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "NAdam";
  /// From params or param groups (which may carry their own NAdamOptions).
  using OptimizerBase::OptimizerBase;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
};

/// Registers "nadam" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_nadam_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool nadam_registered = register_nadam_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
