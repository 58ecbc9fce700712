#pragma once
/// @file
/// Lion, evolved sign momentum (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", arXiv
/// 2302.06675), with timm's semantics and defaults (timm.optim.Lion), and a fused CPU path.

#include <optional>
#include <tuple>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/cyclable_momentum.h"
#include "trainkit/optim/optimizer_base.h"
#include "trainkit/optim/optimizer_options.h"

namespace trainkit::optim {

/// Options of Lion (timm's names and defaults). The paper suggests an lr 3-10x smaller than AdamW's and a
/// weight_decay 3-10x larger, so that lr·weight_decay stays the same.
struct LionOptions : public OptimizerOptions<LionOptions>, public CyclableMomentum {
  using betas_t = std::tuple<double, double>;
  LionOptions() = default;
  /// Options with learning rate `lr`.
  LionOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor)
  /// Learning rate (>= 0): every element moves by lr (times the sign of its interpolated momentum).
  TORCH_ARG(double, lr) = 1e-4;
  /// (β1, β2), each in [0, 1): β1 interpolates the update's sign, β2 is the momentum's running average.
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.99);
  /// Decoupled weight decay (>= 0): p ← p·(1 - lr·weight_decay) before the update.
  TORCH_ARG(double, weight_decay) = 0.0;
  /// Maximize the objective instead of minimizing it.
  TORCH_ARG(bool, maximize) = false;
  /// Kernel choice: unset = the fused CPU kernel where every tensor of the group allows it (contiguous
  /// float32/float64 CPU tensors of one dtype), else the ATen reference path; true = fused, or throw;
  /// false = the reference path.
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;
  /// Multi-tensor ATen path (`_foreach_*` ops, timm's `foreach=True`): unset = on for tensors that are not
  /// on the CPU (CUDA), where the fused CPU kernel does not run; true = always (no fused kernel).
  TORCH_ARG(std::optional<bool>, foreach) = std::nullopt;

 public:
  /// The fields' keys, rules and help (the factory's "lion" arguments), checks and serialization.
  static const OptimizerOptionsBinding<LionOptions>& binding() {
    static const auto b =
        OptimizerOptionsBinding<LionOptions>()
            .bind(TRAINKIT_OPTION(lr), non_negative(), "Learning rate: the size of every element's step")
            .bind(TRAINKIT_OPTION(betas), unit_interval(),
                  "(beta1, beta2): sign of lerp(m, g, 1-beta1) is the update; m = lerp(m, g, 1-beta2)")
            .bind(TRAINKIT_OPTION(weight_decay), non_negative(), "Decoupled weight decay: p <- p (1 - lr wd)")
            .bind(TRAINKIT_OPTION(maximize), "Maximize the objective instead of minimizing it")
            .bind(TRAINKIT_OPTION(fused), kFusedDoc)
            .bind(TRAINKIT_OPTION(foreach), kForeachDoc);
    return b;
  }
  /// β1, the momentum that CyclicLR/OneCycleLR cycle.
  double cycled_momentum() const override { return std::get<0>(betas_); }
  void set_cycled_momentum(double momentum) override { std::get<0>(betas_) = momentum; }
};

/// Per-parameter state of Lion (timm's state_dict name).
struct LionParamState : public torch::optim::OptimizerCloneableParamState<LionParamState> {
  /// Running average of the gradient (β2).
  TORCH_ARG(at::Tensor, exp_avg);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Lion: p ← p·(1 - lr·wd);  p ← p - lr·sign(β1·m + (1-β1)·g);  m ← β2·m + (1-β2)·g
/// (g negated when maximize). Parameters without a gradient are skipped; sparse gradients are rejected.
class Lion : public OptimizerBase<Lion, LionOptions, LionParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Lion";
  /// From params or param groups (which may carry their own LionOptions).
  using OptimizerBase::OptimizerBase;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
};

/// Registers "lion" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_lion_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool lion_registered = register_lion_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
