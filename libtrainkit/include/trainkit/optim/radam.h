#pragma once
/// @file
/// RAdam, Adam with the variance of the adaptive learning rate rectified (Liu et al. 2020, "On the Variance of
/// the Adaptive Learning Rate and Beyond", arXiv 1908.03265), with PyTorch's names, defaults and semantics
/// (torch.optim.RAdam, decoupled_weight_decay included) and a fused CPU kernel.

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/moment_fields.h"
#include "trainkit/optim/optimizer_base.h"

namespace trainkit::optim {

/// Options of RAdam (PyTorch's names and defaults). Also the options of one param group.
struct RAdamOptions : public MomentFields<RAdamOptions> {
  /// Default learning rate.
  static constexpr double kLr = 1e-3;
  RAdamOptions() = default;
  /// Options with learning rate `lr`.
  RAdamOptions(double lr) : MomentFields(lr) {}  // NOLINT(google-explicit-constructor)
  /// Decay the parameters, p ← p·(1 - lr·weight_decay) (AdamW's way), instead of adding the L2 penalty
  /// weight_decay·p to the gradient.
  TORCH_ARG(bool, decoupled_weight_decay) = false;

 public:
  /// The fields' keys, rules and help (the factory's "radam" arguments), checks and serialization.
  static const OptimizerOptionsBinding<RAdamOptions>& binding() {
    static const auto b = moment_binding([](auto& own) {
      own.bind(TRAINKIT_OPTION(decoupled_weight_decay), "Decoupled weight decay p <- p (1 - lr wd) (AdamW's)");
    });
    return b;
  }
};

/// Per-parameter state of RAdam (torch.optim.RAdam's names).
struct RAdamParamState : public torch::optim::OptimizerCloneableParamState<RAdamParamState> {
  /// Steps taken.
  TORCH_ARG(int64_t, step) = 0;
  /// Running average of the gradient.
  TORCH_ARG(at::Tensor, exp_avg);
  /// Running average of the squared gradient.
  TORCH_ARG(at::Tensor, exp_avg_sq);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// RAdam: Adam's moments; with ρ∞ = 2/(1-β2) - 1 and ρt = ρ∞ - 2t·β2^t/(1-β2^t), when ρt > 5
///   p ← p - lr·m̂·r_t·√(1-β2^t)/(√v + eps),  r_t = √((ρt-4)(ρt-2)ρ∞ / ((ρ∞-4)(ρ∞-2)ρt)),
/// else (the variance is intractable) p ← p - lr·m̂, with m̂ = m/(1-β1^t).
class RAdam : public OptimizerBase<RAdam, RAdamOptions, RAdamParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "RAdam";
  /// From params or param groups (which may carry their own RAdamOptions).
  using OptimizerBase::OptimizerBase;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
};

/// Registers "radam" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_radam_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool radam_registered = register_radam_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
