#pragma once
/// @file
/// Adamax, Adam with the infinity norm (Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization",
/// section 7.1, arXiv 1412.6980), with PyTorch's names, defaults and semantics (torch.optim.Adamax) and a fused
/// CPU kernel.

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/moment_fields.h"
#include "trainkit/optim/optimizer_base.h"

namespace trainkit::optim {

/// Options of Adamax (PyTorch's names and defaults). Also the options of one param group.
struct AdamaxOptions : public MomentFields<AdamaxOptions> {
  /// Default learning rate.
  static constexpr double kLr = 2e-3;
  AdamaxOptions() = default;
  /// Options with learning rate `lr`.
  AdamaxOptions(double lr) : MomentFields(lr) {}  // NOLINT(google-explicit-constructor)

  /// The fields' keys, rules and help (the factory's "adamax" arguments), checks and serialization.
  static const OptimizerOptionsBinding<AdamaxOptions>& binding() {
    static const auto b = moment_binding([](auto& /*own*/) {});
    return b;
  }
};

/// Per-parameter state of Adamax (torch.optim.Adamax's names).
struct AdamaxParamState : public torch::optim::OptimizerCloneableParamState<AdamaxParamState> {
  /// Steps taken.
  TORCH_ARG(int64_t, step) = 0;
  /// Running average of the gradient.
  TORCH_ARG(at::Tensor, exp_avg);
  /// Exponentially weighted infinity norm of the gradient.
  TORCH_ARG(at::Tensor, exp_inf);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Adamax: g ← g + wd·p; m ← β1·m + (1-β1)·g; u ← max(β2·u, |g| + eps); p ← p - lr/(1-β1^t)·m/u.
class Adamax : public OptimizerBase<Adamax, AdamaxOptions, AdamaxParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Adamax";
  /// From params or param groups (which may carry their own AdamaxOptions).
  using OptimizerBase::OptimizerBase;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
};

/// Registers "adamax" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_adamax_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool adamax_registered = register_adamax_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
