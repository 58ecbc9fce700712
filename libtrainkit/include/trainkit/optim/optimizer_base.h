#pragma once
/// @file
/// The shell every trainkit optimizer shares (constructors from params or param groups, validation of every
/// group's options, step with a closure, step_scaled for amp::GradScaler, save/load through LibTorch's
/// serialize templates, the fused-or-reference choice), written once as a CRTP base, so that an optimizer
/// supplies only its Options, ParamState, `validate(const Options&)` and `update(inv_scale)`.

#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include "trainkit/optim/optimizer_options.h"
#include "trainkit/optim/scaled_step.h"

namespace trainkit::optim {

/// Helpers of OptimizerBase that need no template parameter (defined in optimizer_base.cpp).
namespace internal {
/// Puts back the options the caller gave each param group: recent LibTorch (2.9+) keeps a group's own
/// options only for its own optimizer types, which would silently drop layer-wise learning rates.
void restore_group_options(torch::optim::Optimizer& optimizer,
                           const std::vector<torch::optim::OptimizerParamGroup>& given);
/// Throws std::invalid_argument "<optimizer>: param group <group> has options of another optimizer ...".
[[noreturn]] void throw_foreign_options(const char* optimizer, std::size_t group);
/// Runs `closure` with gradients enabled (the step itself runs under NoGradGuard), as PyTorch does.
at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure);
/// True when the 0-dim `found_inf` is non-zero.
bool found_inf(const at::Tensor& found_inf);
/// The gradient of `p` (parameter `index` of param group `group`); throws std::invalid_argument when sparse.
const at::Tensor& checked_grad(const at::Tensor& p, std::size_t group, std::size_t index, const char* optimizer);
/// The state of `p` in `optimizer`, created by `init(state)` on first use.
template <class State, class Init>
State& param_state(torch::optim::Optimizer& optimizer, const at::Tensor& p, const Init& init) {
  auto& states = optimizer.state();
  auto it = states.find(p.unsafeGetTensorImpl());
  if (it == states.end()) {
    auto fresh = std::make_unique<State>();
    init(*fresh);
    it = states.emplace(p.unsafeGetTensorImpl(), std::move(fresh)).first;
  }
  return static_cast<State&>(*it->second);
}
/// The path for one group: `fused` unset → the fused CPU kernel when every tensor allows it (contiguous
/// float32/float64 on the CPU, one dtype); true → fused, or std::invalid_argument saying why not;
/// false → the ATen reference path.
bool use_fused(const std::optional<bool>& fused, const std::vector<at::Tensor>& tensors, const char* optimizer,
               std::size_t group);
/// The same for kernels that also take bfloat16/float16 parameters: `values` (parameters and gradients) are
/// contiguous CPU tensors of one dtype, and `state` is of that dtype when it is float32/float64, or, when it
/// is bfloat16/float16 (`reduced_ok`), all float32 or (`reduced_state_ok`) all of the parameters' dtype.
bool use_fused(const std::optional<bool>& fused, const std::vector<at::Tensor>& values,
               const std::vector<at::Tensor>& state, bool reduced_ok, const char* optimizer, std::size_t group,
               bool reduced_state_ok = false);
/// Whether param group `group` takes the multi-tensor ATen path (`_foreach_*` ops): `foreach` true (with
/// `fused` true as well: std::invalid_argument), or `foreach` unset, `fused` not true and a tensor off the
/// CPU (CUDA), where the fused CPU kernels do not run.
bool use_foreach(const std::optional<bool>& foreach, const std::optional<bool>& fused,
                 const std::vector<at::Tensor>& tensors, const char* optimizer, std::size_t group);
/// Whether param group `group` takes ATen's fused kernels (`at::_fused_adam_`, `at::_fused_adamw_`,
/// `at::_fused_sgd_`): `aten_fused` true, or unset with `fused` true and a tensor of `params` off the CPU
/// (CUDA, where trainkit's own fused kernels do not run). std::invalid_argument when `aten_fused` is true with
/// `foreach` true or `fused` false.
bool use_aten_fused(const std::optional<bool>& aten_fused, const std::optional<bool>& fused,
                    const std::optional<bool>& foreach, const std::vector<at::Tensor>& params, const char* optimizer,
                    std::size_t group);
/// Throws std::invalid_argument "<optimizer>: param group <group> cannot use ATen's fused kernel: <why>" unless
/// every tensor of `tensors` (parameters, gradients, state) is dense, contiguous, of one floating dtype and on
/// one device: what ATen's fused kernels take (they keep state in the parameters' dtype).
void check_aten_fusable(const std::vector<at::Tensor>& tensors, const char* optimizer, std::size_t group);
/// The dtype of optimizer state for a parameter of dtype `param`: float32 for bfloat16/float16 (the fused
/// kernels compute in float32 and keep their state in it), else `param`.
at::ScalarType state_dtype(at::ScalarType param);
}  // namespace internal

/// Runs `fused(float{})` or `fused(double{})` (the tensors' dtype) when internal::use_fused() picks the fused
/// kernel for param group `group`, else `reference()`.
template <class Fused, class Reference>
void dispatch_fused(const std::optional<bool>& fused, const std::vector<at::Tensor>& tensors, const char* optimizer,
                    std::size_t group, const Fused& fused_fn, const Reference& reference) {
  if (internal::use_fused(fused, tensors, optimizer, group)) {
    if (tensors.front().scalar_type() == at::kFloat) {
      fused_fn(float{});
    } else {
      fused_fn(double{});
    }
  } else {
    reference();
  }
}

/// Runs `fused(P{})` with P the parameters' element type (float, double, c10::BFloat16 or c10::Half; state
/// float32, or P where `reduced_state_ok`, for the last two) when internal::use_fused(...) picks the fused
/// kernel for param group `group`, else `reference()`.
template <class Fused, class Reference>
void dispatch_fused(const std::optional<bool>& fused, const std::vector<at::Tensor>& values,
                    const std::vector<at::Tensor>& state, bool reduced_ok, const char* optimizer, std::size_t group,
                    const Fused& fused_fn, const Reference& reference, bool reduced_state_ok = false) {
  if (!internal::use_fused(fused, values, state, reduced_ok, optimizer, group, reduced_state_ok)) {
    reference();
    return;
  }
  switch (values.front().scalar_type()) {
    case at::kFloat:
      fused_fn(float{});
      break;
    case at::kDouble:
      fused_fn(double{});
      break;
    case at::kBFloat16:
      fused_fn(c10::BFloat16{});
      break;
    default:
      fused_fn(c10::Half{});
      break;
  }
}

/// Base of trainkit's optimizers. `Derived` supplies:
///   `static constexpr const char* kName`            its name in messages ("Adam");
///   `void update(const at::Tensor& inv_scale)`      one step of every param group, under NoGradGuard, with the
///                                                   gradients multiplied by `inv_scale` (undefined = 1);
/// and may hide `save_extra`/`load_extra` for state beyond the per-parameter ParamState, and `validate` for
/// Options without a binding.
template <class Derived, class Options, class ParamState>
class OptimizerBase : public torch::optim::Optimizer, public ScaledStep {
 public:
  /// The options type of the optimizer and of each of its param groups.
  using options_type = Options;
  /// The per-parameter state type.
  using param_state_type = ParamState;

  /// Param groups may carry their own Options (layer-wise LR, no decay for biases ...); `defaults` fills the
  /// others. Every group's options are validated with Derived::validate.
  explicit OptimizerBase(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, Options defaults = {})
      : Optimizer(param_groups, std::make_unique<Options>(defaults)) {
    internal::restore_group_options(*this, param_groups);
    for (std::size_t i = 0; i < param_groups_.size(); ++i) {
      if (dynamic_cast<const Options*>(&param_groups_[i].options()) == nullptr) {
        internal::throw_foreign_options(Derived::kName, i);
      }
    }
    Derived::validate(defaults);
    for (const auto& group : param_groups_) {
      Derived::validate(static_cast<const Options&>(group.options()));
    }
  }
  /// One param group of `params` with `defaults`.
  explicit OptimizerBase(std::vector<at::Tensor> params, Options defaults = {})
      : OptimizerBase({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  /// Checks `options` against `Options::binding()` (each field's rule, then the requirements across fields);
  /// throws std::invalid_argument "<kName>: <key>: expected <what>, got <value>".
  static void validate(const Options& options) { Options::binding().check(options, Derived::kName); }

  /// One step; `closure` (re-evaluating the loss, with gradients enabled) runs first when given.
  at::Tensor step(LossClosure closure = nullptr) override {
    at::Tensor loss = internal::run_closure(closure);
    at::NoGradGuard no_grad;
    derived().update({});
    return loss;
  }
  /// See ScaledStep: the step of gradients multiplied by `inv_scale`; nothing when `found_inf` is non-zero.
  void step_scaled(const at::Tensor& inv_scale, const at::Tensor& found_inf) override {
    if (!internal::found_inf(found_inf)) {
      at::NoGradGuard no_grad;
      derived().update(inv_scale);
    }
  }
  /// See ScaledStep: the step with `found_inf` on the device; Derived::update_found_inf (Adam, AdamW, Sgd).
  void step_found_inf(const at::Tensor& grad_scale, const at::Tensor& found_inf) override {
    at::NoGradGuard no_grad;
    derived().update_found_inf(grad_scale, found_inf);
  }
  /// Per-parameter state and param groups in LibTorch's format, then Derived::save_extra.
  void save(torch::serialize::OutputArchive& archive) const override {
    torch::optim::serialize<ParamState, Options>(archive, *this);
    static_cast<const Derived&>(*this).save_extra(archive);
  }
  /// Reads what save() wrote.
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<ParamState, Options>(archive, *this);
    derived().load_extra(archive);
  }

 protected:
  /// State beyond ParamState (none by default).
  void save_extra(torch::serialize::OutputArchive& /*archive*/) const {}
  /// See save_extra().
  void load_extra(torch::serialize::InputArchive& /*archive*/) {}
  /// The step of step_found_inf(); optimizers without ATen's fused kernels never take found_inf on the device.
  void update_found_inf(const at::Tensor& /*grad_scale*/, const at::Tensor& /*found_inf*/) {
    throw std::logic_error(std::string(Derived::kName) + " does not take found_inf on the device");
  }

  /// The options of param group `group`.
  const Options& group_options(std::size_t group) const {
    return static_cast<const Options&>(param_groups_[group].options());
  }
  /// The state of `p`, created by `init(state)` on first use.
  template <class Init>
  ParamState& state_of(const at::Tensor& p, const Init& init) {
    return internal::param_state<ParamState>(*this, p, init);
  }
  /// The gradient of `p` (parameter `index` of param group `group`), checked to be dense.
  const at::Tensor& checked_grad(const at::Tensor& p, std::size_t group, std::size_t index) const {
    return internal::checked_grad(p, group, index, Derived::kName);
  }
  /// Whether every param group takes ATen's fused kernels (for Options with `aten_fused`, `fused`, `foreach`).
  bool all_groups_aten_fused() const {
    for (std::size_t i = 0; i < param_groups_.size(); ++i) {
      const Options& o = group_options(i);
      if (!internal::use_aten_fused(o.aten_fused(), o.fused(), o.foreach(), param_groups_[i].params(), Derived::kName,
                                    i)) {
        return false;
      }
    }
    return !param_groups_.empty();
  }
  /// dispatch_fused() for param group `group`.
  template <class Fused, class Reference>
  void dispatch(const std::optional<bool>& fused, const std::vector<at::Tensor>& tensors, std::size_t group,
                const Fused& fused_fn, const Reference& reference) const {
    dispatch_fused(fused, tensors, Derived::kName, group, fused_fn, reference);
  }

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }
};

}  // namespace trainkit::optim
