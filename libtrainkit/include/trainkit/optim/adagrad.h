#pragma once
/// @file
/// Adagrad written from scratch on LibTorch tensors, with a fused single-pass CPU kernel; same numbers as
/// torch.optim.Adagrad (Duchi, Hazan & Singer 2011, "Adaptive Subgradient Methods for Online Learning and
/// Stochastic Optimization", JMLR 12). Not LibTorch's torch::optim::Adagrad: this one has the fused and
/// foreach paths, GradScaler's hook and the factory's "adagrad".

#include <optional>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/optimizer_base.h"
#include "trainkit/optim/optimizer_options.h"

namespace trainkit::optim {

/// Options of Adagrad (PyTorch's names and defaults). Also the options of one param group.
struct AdagradOptions : public OptimizerOptions<AdagradOptions> {
  AdagradOptions() = default;
  /// Options with learning rate `lr`.
  AdagradOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor): AdagradOptions(1e-2) reads like Python
  /// Learning rate (>= 0).
  TORCH_ARG(double, lr) = 1e-2;
  /// Learning-rate decay (>= 0): step t uses lr / (1 + (t - 1)·lr_decay).
  TORCH_ARG(double, lr_decay) = 0;
  /// L2 penalty added to the gradient (>= 0).
  TORCH_ARG(double, weight_decay) = 0;
  /// Starting value of every element of the accumulated squared gradient `sum` (>= 0). Read from the
  /// parameter's own group, as LibTorch's C++ Adagrad does (torch.optim reads the optimizer's defaults).
  TORCH_ARG(double, initial_accumulator_value) = 0;
  /// Added to the denominator √sum (>= 0).
  TORCH_ARG(double, eps) = 1e-10;
  /// Maximize the objective instead of minimizing it.
  TORCH_ARG(bool, maximize) = false;
  /// Kernel choice: unset = the fused CPU kernel where every tensor of the group allows it (contiguous
  /// float32/float64 CPU tensors of one dtype), else the ATen reference path; true = fused, or throw;
  /// false = always the reference path.
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;
  /// Multi-tensor ATen path (`_foreach_*` ops, as PyTorch's `foreach=True`): unset = on for tensors that
  /// are not on the CPU (CUDA), where the fused CPU kernel does not run; true = always (no fused kernel).
  TORCH_ARG(std::optional<bool>, foreach) = std::nullopt;

 public:
  /// The fields' keys, rules and help (the factory's "adagrad" arguments), checks and serialization.
  static const OptimizerOptionsBinding<AdagradOptions>& binding() {
    static const auto b =
        OptimizerOptionsBinding<AdagradOptions>()
            .bind(TRAINKIT_OPTION(lr), non_negative(), "Learning rate")
            .bind(TRAINKIT_OPTION(lr_decay), non_negative(), "Learning-rate decay: step t uses lr / (1 + (t-1) lr_decay)")
            .bind(TRAINKIT_OPTION(weight_decay), non_negative(), "L2 penalty added to the gradient")
            .bind(TRAINKIT_OPTION(initial_accumulator_value), non_negative(),
                  "Starting value of the accumulated squared gradient")
            .bind(TRAINKIT_OPTION(eps), non_negative(), "Term added to the denominator")
            .bind(TRAINKIT_OPTION(maximize), "Maximize the objective instead of minimizing it")
            .bind(TRAINKIT_OPTION(fused), kFusedDoc)
            .bind(TRAINKIT_OPTION(foreach), kForeachDoc);
    return b;
  }
};

/// Per-parameter state of Adagrad (PyTorch's state_dict names).
struct AdagradParamState : public torch::optim::OptimizerCloneableParamState<AdagradParamState> {
  /// Steps taken for this parameter.
  TORCH_ARG(int64_t, step) = 0;
  /// Accumulated squared gradient, from initial_accumulator_value.
  TORCH_ARG(at::Tensor, sum);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Adagrad: g' = ±g + wd·p; sum ← sum + g'²; p ← p - lr/(1 + (t-1)·lr_decay) · g' / (√sum + eps).
/// Parameters without a gradient are skipped; sparse gradients are rejected.
class Adagrad : public OptimizerBase<Adagrad, AdagradOptions, AdagradParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Adagrad";
  /// From params or param groups (which may carry their own AdagradOptions).
  using OptimizerBase::OptimizerBase;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
};

/// Registers "adagrad" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_adagrad_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool adagrad_registered = register_adagrad_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
