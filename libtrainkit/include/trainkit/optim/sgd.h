#pragma once
/// @file
/// SGD with momentum / nesterov, written from scratch with a fused single-pass CPU kernel; same numbers as
/// torch.optim.SGD. The baseline LARS is measured against.

#include <optional>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/cyclable_momentum.h"
#include "trainkit/optim/optimizer_base.h"
#include "trainkit/optim/optimizer_options.h"

namespace trainkit::optim {

/// Binds the fields Sgd and Lars share (lr, momentum, dampening, weight_decay, nesterov) into `b`, with
/// nesterov's requirement (momentum > 0, dampening 0).
template <class Options>
OptimizerOptionsBinding<Options> bind_momentum_fields(OptimizerOptionsBinding<Options> b, const char* weight_decay_doc) {
  b.bind(TRAINKIT_OPTION(lr), non_negative(), "Learning rate")
      .bind(TRAINKIT_OPTION(momentum), non_negative(), "Momentum factor")
      .bind(TRAINKIT_OPTION(dampening), non_negative(), "Dampening for momentum")
      .bind(TRAINKIT_OPTION(weight_decay), non_negative(), weight_decay_doc)
      .bind(TRAINKIT_OPTION(nesterov), "Nesterov momentum (needs momentum > 0, dampening 0)")
      .require([](const Options& o) {
        return !o.nesterov() || (o.momentum() > 0 && o.dampening() == 0)
                   ? std::string()
                   : "nesterov momentum requires a momentum > 0 and zero dampening (momentum = " +
                         ArgValue(o.momentum()).to_string() + ", dampening = " + ArgValue(o.dampening()).to_string() +
                         ")";
      });
  return b;
}

/// Options of Sgd (PyTorch's names and defaults).
struct SgdOptions : public OptimizerOptions<SgdOptions>, public CyclableMomentum {
  SgdOptions() = default;
  /// Options with learning rate `lr`.
  SgdOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor)
  /// Learning rate (>= 0).
  TORCH_ARG(double, lr) = 1e-3;
  /// Momentum factor (>= 0); 0 = plain SGD.
  TORCH_ARG(double, momentum) = 0;
  /// Dampening of the momentum (>= 0): b ← momentum·b + (1 - dampening)·g.
  TORCH_ARG(double, dampening) = 0;
  /// L2 penalty added to the gradient (>= 0).
  TORCH_ARG(double, weight_decay) = 0;
  /// Nesterov momentum (needs momentum > 0 and dampening = 0).
  TORCH_ARG(bool, nesterov) = false;
  /// Maximize the objective instead of minimizing it.
  TORCH_ARG(bool, maximize) = false;
  /// Kernel choice: unset = fused where possible (contiguous CPU float32/float64, or bfloat16/float16
  /// parameters with a float32 momentum buffer, the one Sgd creates for them), true = fused or throw,
  /// false = ATen reference path.
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;
  /// Multi-tensor ATen path (`_foreach_*` ops, as PyTorch's `foreach=True`): unset = on for tensors that
  /// are not on the CPU (CUDA), where the fused CPU kernel does not run; true = always (no fused kernel).
  TORCH_ARG(std::optional<bool>, foreach) = std::nullopt;
  /// ATen's fused kernel (`at::_fused_sgd_`, PyTorch's `fused=True`): unset = when `fused` is true and the
  /// group's tensors are off the CPU (CUDA); true = on any device (not with foreach = true or fused = false;
  /// an error where the kernel cannot take the group's tensors); false = never. It takes GradScaler's scale
  /// and found-inf flag on the device (no host read).
  TORCH_ARG(std::optional<bool>, aten_fused) = std::nullopt;

 public:
  /// The fields' keys, rules and help (the factory's "sgd" arguments), checks and serialization.
  static const OptimizerOptionsBinding<SgdOptions>& binding() {
    static const auto b = bind_momentum_fields(OptimizerOptionsBinding<SgdOptions>(), "L2 penalty added to the gradient")
                              .bind(TRAINKIT_OPTION(maximize), "Maximize the objective instead of minimizing it")
                              .bind(TRAINKIT_OPTION(fused), kFusedDoc)
                              .bind(TRAINKIT_OPTION(foreach), kForeachDoc)
                              .bind(TRAINKIT_OPTION(aten_fused), kAtenFusedDoc);
    return b;
  }
  double cycled_momentum() const override { return momentum_; }
  void set_cycled_momentum(double momentum) override { momentum_ = momentum; }
};

/// Per-parameter state of Sgd.
struct SgdParamState : public torch::optim::OptimizerCloneableParamState<SgdParamState> {
  /// The momentum buffer (created on the first step with momentum).
  TORCH_ARG(at::Tensor, momentum_buffer);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Stochastic gradient descent: d = g + wd·p; b ← momentum·b + (1-dampening)·d (b = d at first);
/// d = nesterov ? d + momentum·b : b; p ← p - lr·d.
class Sgd : public OptimizerBase<Sgd, SgdOptions, SgdParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Sgd";
  /// From params or param groups (which may carry their own SgdOptions).
  using OptimizerBase::OptimizerBase;
  /// True when every param group takes ATen's fused kernel (SgdOptions::aten_fused).
  bool takes_found_inf() const override;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
  void update_found_inf(const at::Tensor& grad_scale, const at::Tensor& found_inf);
};

/// Registers "sgd" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_sgd_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool sgd_registered = register_sgd_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
