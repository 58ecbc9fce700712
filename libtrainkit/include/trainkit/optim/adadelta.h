#pragma once
/// @file
/// Adadelta written from scratch on LibTorch tensors (reference and foreach paths); same numbers as
/// torch.optim.Adadelta (Zeiler 2012, "ADADELTA: An Adaptive Learning Rate Method", arXiv 1212.5701).

#include <optional>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/optimizer_base.h"
#include "trainkit/optim/optimizer_options.h"

namespace trainkit::optim {

/// Options of Adadelta (PyTorch's names and defaults). Also the options of one param group.
struct AdadeltaOptions : public OptimizerOptions<AdadeltaOptions> {
  AdadeltaOptions() = default;
  /// Options with learning rate `lr`.
  AdadeltaOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor)
  /// Coefficient scaling the delta before it is applied (>= 0).
  TORCH_ARG(double, lr) = 1.0;
  /// Coefficient of the running averages of g² and of the squared update, in [0, 1].
  TORCH_ARG(double, rho) = 0.9;
  /// Added inside both square roots (>= 0).
  TORCH_ARG(double, eps) = 1e-6;
  /// L2 penalty added to the gradient (>= 0).
  TORCH_ARG(double, weight_decay) = 0;
  /// Maximize the objective instead of minimizing it.
  TORCH_ARG(bool, maximize) = false;
  /// Multi-tensor ATen path (`_foreach_*` ops, as PyTorch's `foreach=True`): unset = on for tensors that
  /// are not on the CPU (CUDA); true = always. There is no fused CPU kernel: otherwise the reference path.
  TORCH_ARG(std::optional<bool>, foreach) = std::nullopt;

 public:
  /// The fields' keys, rules and help (the factory's "adadelta" arguments), checks and serialization.
  static const OptimizerOptionsBinding<AdadeltaOptions>& binding() {
    static const auto b =
        OptimizerOptionsBinding<AdadeltaOptions>()
            .bind(TRAINKIT_OPTION(lr), non_negative(), "Learning rate")
            .bind(TRAINKIT_OPTION(rho), closed_unit_interval(), "Running-average coefficient of g^2 and of the squared delta")
            .bind(TRAINKIT_OPTION(eps), non_negative(), "Term added inside the square roots")
            .bind(TRAINKIT_OPTION(weight_decay), non_negative(), "L2 penalty added to the gradient")
            .bind(TRAINKIT_OPTION(maximize), "Maximize the objective instead of minimizing it")
            .bind(TRAINKIT_OPTION(foreach), kForeachDoc);
    return b;
  }
};

/// Per-parameter state of Adadelta (PyTorch's state_dict names).
struct AdadeltaParamState : public torch::optim::OptimizerCloneableParamState<AdadeltaParamState> {
  /// Steps taken for this parameter.
  TORCH_ARG(int64_t, step) = 0;
  /// Running average of the squared gradient.
  TORCH_ARG(at::Tensor, square_avg);
  /// Running average of the squared delta.
  TORCH_ARG(at::Tensor, acc_delta);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Adadelta: g' = ±g + wd·p; v ← ρv + (1-ρ)g'²; δ = √(u + eps) / √(v + eps) · g'; u ← ρu + (1-ρ)δ²;
/// p ← p - lr·δ. Parameters without a gradient are skipped; sparse gradients are rejected.
class Adadelta : public OptimizerBase<Adadelta, AdadeltaOptions, AdadeltaParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Adadelta";
  /// From params or param groups (which may carry their own AdadeltaOptions).
  using OptimizerBase::OptimizerBase;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
};

/// Registers "adadelta" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_adadelta_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool adadelta_registered = register_adadelta_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
