#pragma once
/// @file
/// ASGD (averaged stochastic gradient descent) written from scratch on LibTorch tensors (reference and
/// foreach paths); same numbers as torch.optim.ASGD (Polyak & Juditsky 1992, "Acceleration of Stochastic
/// Approximation by Averaging", SIAM J. Control Optim. 30(4)).

#include <optional>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/optimizer_base.h"
#include "trainkit/optim/optimizer_options.h"

namespace trainkit::optim {

/// Options of Asgd (PyTorch's names and defaults). Also the options of one param group.
struct AsgdOptions : public OptimizerOptions<AsgdOptions> {
  AsgdOptions() = default;
  /// Options with learning rate `lr`.
  AsgdOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor)
  /// Learning rate (>= 0): the first step's η, and the scale of η_t = lr / (1 + lambd·lr·t)^alpha.
  TORCH_ARG(double, lr) = 1e-2;
  /// Decay term (>= 0): p ← p·(1 - lambd·η) each step, and in η's schedule.
  TORCH_ARG(double, lambd) = 1e-4;
  /// Power of η's decay (>= 0).
  TORCH_ARG(double, alpha) = 0.75;
  /// Step after which averaging starts (>= 0): μ_t = 1 / max(1, t - t0).
  TORCH_ARG(double, t0) = 1e6;
  /// L2 penalty added to the gradient (>= 0).
  TORCH_ARG(double, weight_decay) = 0;
  /// Maximize the objective instead of minimizing it.
  TORCH_ARG(bool, maximize) = false;
  /// Multi-tensor ATen path (`_foreach_*` ops, as PyTorch's `foreach=True`): unset = on for tensors that
  /// are not on the CPU (CUDA); true = always. There is no fused CPU kernel: otherwise the reference path.
  TORCH_ARG(std::optional<bool>, foreach) = std::nullopt;

 public:
  /// The fields' keys, rules and help (the factory's "asgd" arguments), checks and serialization.
  static const OptimizerOptionsBinding<AsgdOptions>& binding() {
    static const auto b =
        OptimizerOptionsBinding<AsgdOptions>()
            .bind(TRAINKIT_OPTION(lr), non_negative(), "Learning rate")
            .bind(TRAINKIT_OPTION(lambd), non_negative(), "Decay term: p <- p (1 - lambd eta); eta_t = lr / (1 + lambd lr t)^alpha")
            .bind(TRAINKIT_OPTION(alpha), non_negative(), "Power of eta's decay")
            .bind(TRAINKIT_OPTION(t0), non_negative(), "Step after which averaging starts: mu_t = 1 / max(1, t - t0)")
            .bind(TRAINKIT_OPTION(weight_decay), non_negative(), "L2 penalty added to the gradient")
            .bind(TRAINKIT_OPTION(maximize), "Maximize the objective instead of minimizing it")
            .bind(TRAINKIT_OPTION(foreach), kForeachDoc);
    return b;
  }
};

/// Per-parameter state of Asgd (PyTorch's state_dict names). `eta` and `mu` hold float32 values, as
/// torch.optim's 0-dim float32 tensors do (its trajectories depend on that rounding).
struct AsgdParamState : public torch::optim::OptimizerCloneableParamState<AsgdParamState> {
  /// Steps taken for this parameter.
  TORCH_ARG(int64_t, step) = 0;
  /// Step size of the next step (the group's lr before the first).
  TORCH_ARG(double, eta) = 0;
  /// Averaging weight of the next step (1: ax takes the parameter).
  TORCH_ARG(double, mu) = 1;
  /// The averaged parameter.
  TORCH_ARG(at::Tensor, ax);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// ASGD: g' = ±g + wd·p; p ← p·(1 - λη) - η·g'; ax ← ax + μ(p - ax) (μ = 1: ax ← p); then
/// η ← lr / (1 + λ·lr·t)^α and μ ← 1 / max(1, t - t0). Parameters without a gradient are skipped.
class Asgd : public OptimizerBase<Asgd, AsgdOptions, AsgdParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Asgd";
  /// From params or param groups (which may carry their own AsgdOptions).
  using OptimizerBase::OptimizerBase;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
};

/// Registers "asgd" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_asgd_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool asgd_registered = register_asgd_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
