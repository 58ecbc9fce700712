#pragma once
/// @file
/// Adam and AdamW written from scratch on LibTorch tensors, with a fused single-pass CPU kernel.
/// Same numbers as PyTorch's torch.optim.Adam / AdamW (Kingma & Ba 2015, arXiv 1412.6980;
/// Loshchilov & Hutter 2019, arXiv 1711.05101).

#include <optional>
#include <tuple>
#include <vector>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/cyclable_momentum.h"
#include "trainkit/optim/optimizer_base.h"

namespace trainkit::optim {

/// Options of Adam (PyTorch's names and defaults). Also the options of one param group.
struct AdamOptions : public torch::optim::OptimizerCloneableOptions<AdamOptions>, public CyclableMomentum {
  using betas_t = std::tuple<double, double>;
  AdamOptions() = default;
  /// Options with learning rate `lr`.
  AdamOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor): AdamOptions(1e-3) reads like Python
  /// Learning rate (>= 0).
  TORCH_ARG(double, lr) = 1e-3;
  /// Coefficients (β1, β2) of the running averages of the gradient and its square, each in [0, 1).
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the denominator for numerical stability (>= 0).
  TORCH_ARG(double, eps) = 1e-8;
  /// L2 penalty added to the gradient: g ← g + weight_decay·p (>= 0).
  TORCH_ARG(double, weight_decay) = 0;
  /// Use the maximum of past squared-gradient averages (Reddi et al. 2018, "On the Convergence of Adam").
  TORCH_ARG(bool, amsgrad) = false;
  /// Maximize the objective instead of minimizing it.
  TORCH_ARG(bool, maximize) = false;
  /// Kernel choice: unset = the fused CPU kernel where every tensor of the group allows it (contiguous
  /// CPU tensors: float32/float64 of one dtype, or bfloat16/float16 parameters and gradients with float32
  /// state or state of their own dtype), else the ATen reference path; true = fused, or throw;
  /// false = always the reference path.
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;
  /// Multi-tensor ATen path (`_foreach_*` ops, as PyTorch's `foreach=True`): unset = on for tensors that
  /// are not on the CPU (CUDA), where the fused CPU kernel does not run; true = always (no fused kernel).
  TORCH_ARG(std::optional<bool>, foreach) = std::nullopt;
  /// ATen's fused kernel (`at::_fused_adam_`/`at::_fused_adamw_`, PyTorch's `fused=True`): unset = when
  /// `fused` is true and the group's tensors are off the CPU (CUDA); true = on any device (not with
  /// foreach = true or fused = false; an error where the kernel cannot take the group's tensors);
  /// false = never. It takes GradScaler's scale and found-inf flag on the device (no host read).
  TORCH_ARG(std::optional<bool>, aten_fused) = std::nullopt;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { lr_ = lr; }
  /// β1, the momentum that CyclicLR/OneCycleLR cycle.
  double cycled_momentum() const override { return std::get<0>(betas_); }
  void set_cycled_momentum(double momentum) override { std::get<0>(betas_) = momentum; }
};

/// Options of AdamW: Adam's, with decoupled weight decay p ← p·(1 - lr·weight_decay) and its default 1e-2.
struct AdamWOptions : public torch::optim::OptimizerCloneableOptions<AdamWOptions>,
                      public CyclableMomentum {
  using betas_t = std::tuple<double, double>;
  AdamWOptions() = default;
  /// Options with learning rate `lr`.
  AdamWOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor)
  /// Learning rate (>= 0).
  TORCH_ARG(double, lr) = 1e-3;
  /// Coefficients (β1, β2), each in [0, 1).
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the denominator for numerical stability (>= 0).
  TORCH_ARG(double, eps) = 1e-8;
  /// Decoupled weight decay coefficient (>= 0).
  TORCH_ARG(double, weight_decay) = 1e-2;
  /// Use the maximum of past squared-gradient averages.
  TORCH_ARG(bool, amsgrad) = false;
  /// Maximize the objective instead of minimizing it.
  TORCH_ARG(bool, maximize) = false;
  /// Kernel choice, as AdamOptions::fused.
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;
  /// Multi-tensor ATen path (`_foreach_*` ops, as PyTorch's `foreach=True`): unset = on for tensors that
  /// are not on the CPU (CUDA), where the fused CPU kernel does not run; true = always (no fused kernel).
  TORCH_ARG(std::optional<bool>, foreach) = std::nullopt;
  /// ATen's fused kernel (`at::_fused_adam_`/`at::_fused_adamw_`, PyTorch's `fused=True`): unset = when
  /// `fused` is true and the group's tensors are off the CPU (CUDA); true = on any device (not with
  /// foreach = true or fused = false; an error where the kernel cannot take the group's tensors);
  /// false = never. It takes GradScaler's scale and found-inf flag on the device (no host read).
  TORCH_ARG(std::optional<bool>, aten_fused) = std::nullopt;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { lr_ = lr; }
  double cycled_momentum() const override { return std::get<0>(betas_); }
  void set_cycled_momentum(double momentum) override { std::get<0>(betas_) = momentum; }
};

/// Per-parameter state of Adam and AdamW (PyTorch's state_dict names). Created in float32 for bfloat16/float16
/// parameters (each step computes in float32 and rounds the parameter once); a state of the parameter's dtype
/// (as torch.optim keeps it, e.g. loaded) is kept and rounded once per step too.
struct AdamParamState : public torch::optim::OptimizerCloneableParamState<AdamParamState> {
  /// Steps taken for this parameter.
  TORCH_ARG(int64_t, step) = 0;
  /// Running average of the gradient.
  TORCH_ARG(at::Tensor, exp_avg);
  /// Running average of the squared gradient.
  TORCH_ARG(at::Tensor, exp_avg_sq);
  /// Running maximum of exp_avg_sq (amsgrad only).
  TORCH_ARG(at::Tensor, max_exp_avg_sq);
  /// The step count as a 0-dim float32 tensor on the parameter's device, kept while ATen's fused kernels
  /// step (they count, and skip on found-inf, on the device). When defined it is the count: `step` is
  /// brought up to date from it (a host read) on save and when another path steps. Not saved itself.
  TORCH_ARG(at::Tensor, device_step);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};
/// AdamW keeps the same state as Adam.
using AdamWParamState = AdamParamState;

/// Adam. Parameters without a gradient are skipped; sparse gradients are rejected.
class Adam : public OptimizerBase<Adam, AdamOptions, AdamParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Adam";
  /// From params or param groups (which may carry their own AdamOptions: layer-wise LR, no decay ...).
  using OptimizerBase::OptimizerBase;
  /// Throws std::invalid_argument naming the option and value unless lr >= 0, eps >= 0, betas in [0, 1),
  /// weight_decay >= 0.
  static void validate(const AdamOptions& options);
  /// True when every param group takes ATen's fused kernel (AdamOptions::aten_fused).
  bool takes_found_inf() const override;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
  void update_found_inf(const at::Tensor& grad_scale, const at::Tensor& found_inf);
};

/// AdamW (decoupled weight decay).
class AdamW : public OptimizerBase<AdamW, AdamWOptions, AdamWParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "AdamW";
  /// From params or param groups.
  using OptimizerBase::OptimizerBase;
  /// As Adam::validate.
  static void validate(const AdamWOptions& options);
  /// True when every param group takes ATen's fused kernel (AdamWOptions::aten_fused).
  bool takes_found_inf() const override;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
  void update_found_inf(const at::Tensor& grad_scale, const at::Tensor& found_inf);
};

/// Registers "adam" and "adamw" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_adam_optimizers();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool adam_registered = register_adam_optimizers();
}  // namespace internal

}  // namespace trainkit::optim
