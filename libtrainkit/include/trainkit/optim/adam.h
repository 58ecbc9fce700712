#pragma once
/// @file
/// Adam and AdamW written from scratch on LibTorch tensors, with a fused single-pass CPU kernel.
/// Same numbers as PyTorch's torch.optim.Adam / AdamW (Kingma & Ba 2015, arXiv 1412.6980;
/// Loshchilov & Hutter 2019, arXiv 1711.05101).

#include <optional>
#include <tuple>
#include <vector>

#include <torch/optim/optimizer.h>

#include "trainkit/optim/cyclable_momentum.h"
#include "trainkit/optim/optimizer_base.h"
#include "trainkit/optim/optimizer_options.h"

namespace trainkit::optim {

/// The fields of Adam's options and their binding, shared by AdamOptions and AdamWOptions (`Self`), which
/// differ only in what weight decay means (`Self::kDecoupled`) and its default (`Self::kWeightDecay`).
template <class Self>
struct AdamFields : public OptimizerOptions<Self>, public CyclableMomentum {
  using betas_t = std::tuple<double, double>;
  /// Learning rate (>= 0).
  TRAINKIT_SHARED_ARG(double, lr) = 1e-3;
  /// Coefficients (β1, β2) of the running averages of the gradient and its square, each in [0, 1).
  TRAINKIT_SHARED_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the denominator for numerical stability (>= 0).
  TRAINKIT_SHARED_ARG(double, eps) = 1e-8;
  /// Weight decay (>= 0): Adam adds the L2 penalty weight_decay·p to the gradient; AdamW decays the
  /// parameters, p ← p·(1 - lr·weight_decay).
  TRAINKIT_SHARED_ARG(double, weight_decay) = Self::kWeightDecay;
  /// Use the maximum of past squared-gradient averages (Reddi et al. 2018, "On the Convergence of Adam").
  TRAINKIT_SHARED_ARG(bool, amsgrad) = false;
  /// Maximize the objective instead of minimizing it.
  TRAINKIT_SHARED_ARG(bool, maximize) = false;
  /// Kernel choice: unset = the fused CPU kernel where every tensor of the group allows it (contiguous
  /// CPU tensors: float32/float64 of one dtype, or bfloat16/float16 parameters and gradients with float32
  /// state or state of their own dtype), else the ATen reference path; true = fused, or throw;
  /// false = always the reference path.
  TRAINKIT_SHARED_ARG(std::optional<bool>, fused) = std::nullopt;
  /// Multi-tensor ATen path (`_foreach_*` ops, as PyTorch's `foreach=True`): unset = on for tensors that
  /// are not on the CPU (CUDA), where the fused CPU kernel does not run; true = always (no fused kernel).
  TRAINKIT_SHARED_ARG(std::optional<bool>, foreach) = std::nullopt;
  /// ATen's fused kernel (`at::_fused_adam_`/`at::_fused_adamw_`, PyTorch's `fused=True`): unset = when
  /// `fused` is true and the group's tensors are off the CPU (CUDA); true = on any device (not with
  /// foreach = true or fused = false; an error where the kernel cannot take the group's tensors);
  /// false = never. It takes GradScaler's scale and found-inf flag on the device (no host read).
  TRAINKIT_SHARED_ARG(std::optional<bool>, aten_fused) = std::nullopt;

 public:
  /// The fields' keys, rules and help (the factory's "adam"/"adamw" arguments), checks and serialization.
  static const OptimizerOptionsBinding<Self>& binding() {
    static const auto b =
        OptimizerOptionsBinding<Self>()
            .bind(TRAINKIT_OPTION(lr), non_negative(), "Learning rate")
            .bind(TRAINKIT_OPTION(betas), unit_interval(), "(beta1, beta2): running-average coefficients of g and g^2")
            .bind(TRAINKIT_OPTION(eps), non_negative(), "Term added to the denominator")
            .bind(TRAINKIT_OPTION(weight_decay), non_negative(),
                  Self::kDecoupled ? "Decoupled weight decay: p <- p (1 - lr wd)" : "L2 penalty added to the gradient")
            .bind(TRAINKIT_OPTION(amsgrad), "AMSGrad: the maximum of past squared-gradient averages")
            .bind(TRAINKIT_OPTION(maximize), "Maximize the objective instead of minimizing it")
            .bind(TRAINKIT_OPTION(fused), kFusedDoc)
            .bind(TRAINKIT_OPTION(foreach), kForeachDoc)
            .bind(TRAINKIT_OPTION(aten_fused), kAtenFusedDoc);
    return b;
  }
  /// β1, the momentum that CyclicLR/OneCycleLR cycle.
  double cycled_momentum() const override { return std::get<0>(betas_); }
  void set_cycled_momentum(double momentum) override { std::get<0>(betas_) = momentum; }

 protected:
  AdamFields() = default;
  explicit AdamFields(double lr) : lr_(lr) {}
};

/// Options of Adam (PyTorch's names and defaults). Also the options of one param group.
struct AdamOptions : public AdamFields<AdamOptions> {
  /// Weight decay is the L2 penalty added to the gradient: g ← g + weight_decay·p.
  static constexpr bool kDecoupled = false;
  /// Default weight_decay.
  static constexpr double kWeightDecay = 0.0;
  AdamOptions() = default;
  /// Options with learning rate `lr`.
  AdamOptions(double lr) : AdamFields(lr) {}  // NOLINT(google-explicit-constructor): AdamOptions(1e-3) reads like Python
};

/// Options of AdamW: Adam's fields, with decoupled weight decay p ← p·(1 - lr·weight_decay) and its default 1e-2.
struct AdamWOptions : public AdamFields<AdamWOptions> {
  /// Weight decay is decoupled from the gradient (Loshchilov & Hutter).
  static constexpr bool kDecoupled = true;
  /// Default weight_decay.
  static constexpr double kWeightDecay = 1e-2;
  AdamWOptions() = default;
  /// Options with learning rate `lr`.
  AdamWOptions(double lr) : AdamFields(lr) {}  // NOLINT(google-explicit-constructor)
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

/// The optimizer class of Adam and AdamW (`Self`, with its `kName`), which differ only in their Options.
/// Parameters without a gradient are skipped; sparse gradients are rejected.
template <class Self, class Options>
class AdamFamily : public OptimizerBase<Self, Options, AdamParamState> {
 public:
  /// From params or param groups (which may carry their own Options: layer-wise LR, no decay ...).
  using OptimizerBase<Self, Options, AdamParamState>::OptimizerBase;
  /// True when every param group takes ATen's fused kernel (Options::aten_fused).
  bool takes_found_inf() const override;

 private:
  friend OptimizerBase<Self, Options, AdamParamState>;
  void update(const at::Tensor& inv_scale);
  void update_found_inf(const at::Tensor& grad_scale, const at::Tensor& found_inf);
};

/// Adam.
class Adam : public AdamFamily<Adam, AdamOptions> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Adam";
  using AdamFamily::AdamFamily;
};

/// AdamW (decoupled weight decay).
class AdamW : public AdamFamily<AdamW, AdamWOptions> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "AdamW";
  using AdamFamily::AdamFamily;
};

/// Registers "adam" and "adamw" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_adam_optimizers();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool adam_registered = register_adam_optimizers();
}  // namespace internal

}  // namespace trainkit::optim
