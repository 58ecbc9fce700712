#pragma once
/// @file
/// Dynamic loss scaling with the semantics of Python's `torch.amp.GradScaler`: the loss is multiplied by a
/// scale before backward so that small float16 gradients do not underflow; gradients are unscaled (and
/// checked for inf/NaN) before the optimizer step, which is skipped when any is non-finite; the scale backs
/// off after such a step and grows after `growth_interval` clean ones.
///
///     trainkit::amp::GradScaler scaler(torch::kCUDA);
///     for (auto& batch : loader) {
///       opt.zero_grad();
///       at::Tensor loss;
///       {
///         trainkit::amp::Autocast autocast(torch::kCUDA, torch::kHalf);
///         loss = loss_fn(model->forward(batch.data), batch.target);
///       }
///       scaler.scale(loss).backward();
///       scaler.unscale_(opt);                                          // optional: only to see true gradients
///       torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);   // clips the unscaled gradients
///       scaler.step(opt);                                              // skipped on inf/NaN
///       scaler.update();
///     }

#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "trainkit/options.h"

namespace trainkit::amp {

/// Options of GradScaler, with PyTorch's argument names and defaults.
struct GradScalerOptions {
  /// The scale before the first update; finite and > 0.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// Multiplies the scale after `growth_interval` consecutive steps without inf/NaN; > 1.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Multiplies the scale after a step with inf/NaN gradients; in (0, 1).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Consecutive clean steps before the scale grows; >= 1.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// false: scale() returns the loss, step() just steps, everything else is a no-op.
  TORCH_ARG(bool, enabled) = true;

 public:
  /// The options by key, with their rules and help (`trainkit train`'s [amp]).
  static const OptionBinding<GradScalerOptions>& binding() {
    static const auto b = OptionBinding<GradScalerOptions>()
                              .bind(TRAINKIT_OPTION(init_scale), rule::number(positive()), "GradScaler's initial scale")
                              .bind(TRAINKIT_OPTION(growth_factor), rule::number({"number > 1", 1.0, true}),
                                    "GradScaler: multiplies the scale after growth_interval clean steps")
                              .bind(TRAINKIT_OPTION(backoff_factor),
                                    rule::number({"number in (0, 1)", 0.0, true, 1.0, true}),
                                    "GradScaler: multiplies the scale after a step with inf/NaN gradients")
                              .bind(TRAINKIT_OPTION(growth_interval), rule::integer(1),
                                    "GradScaler: clean steps before the scale grows");
    return b;
  }
};

/// Where an optimizer is in the current iteration (Python's `OptState`).
enum class OptState { READY, UNSCALED, STEPPED };

/// Dynamic loss scaler (Python's `torch.amp.GradScaler`). Not thread-safe; one per training loop.
///
/// Per iteration: scale(loss).backward(), optionally unscale_(opt), step(opt) for every optimizer, then
/// update() once. The scale lives in a float32 0-dim tensor on the scaler's device; the only host reads are
/// step()'s (the inf flags, once per optimizer, none for ATen's fused kernels) and the getters'.
class GradScaler {
 public:
  /// A scaler whose scale tensor lives on `device` (Python's `GradScaler("cpu")` / `GradScaler("cuda")`).
  /// Throws std::invalid_argument naming an option out of range. An enabled CUDA scaler without a usable
  /// CUDA device is disabled with a warning, as in Python.
  explicit GradScaler(c10::Device device = c10::kCPU, GradScalerOptions options = {});

  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;

  /// Returns `loss · scale` (the scale tensor is created on first use); the loss itself when disabled.
  at::Tensor scale(const at::Tensor& loss);
  /// scale() for each of several outputs (e.g. several losses).
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  /// Divides the gradients of `opt`'s parameters in place by the scale (multiplies by
  /// inv_scale = float32(1 / float64(scale))) and records, per device, whether any is inf/NaN.
  /// At most once per optimizer between update()s and before step(), else std::logic_error; needs a
  /// scale() earlier in the iteration. Sparse gradients throw std::invalid_argument (unsupported), float16
  /// gradients too (keep float32 master parameters). No-op when disabled.
  void unscale_(torch::optim::Optimizer& opt);

  /// Unscales `opt`'s gradients unless unscale_() already did, then calls `opt.step()` unless any of them
  /// was inf/NaN (one host read). Returns whether `opt.step()` ran; a disabled scaler always steps.
  /// An optimizer whose param groups all step through ATen's fused kernels (optim::ScaledStep::
  /// takes_found_inf: `aten_fused`) gets the scale and the found-inf flag instead, as PyTorch's fused
  /// optimizers do: it divides the gradients and skips on the device, nothing is read, and step() returns
  /// true (whether the kernel skipped stays on the device; update() backs off the scale as usual).
  /// Once per optimizer between update()s, else std::logic_error.
  bool step(torch::optim::Optimizer& opt);

  /// Ends the iteration. Without `new_scale`: if any gradient checked this iteration (by step() or
  /// unscale_(), over all optimizers) was inf/NaN, scale ← scale · backoff_factor and tracker ← 0; else
  /// tracker ← tracker + 1, and when that reaches growth_interval, scale ← scale · growth_factor and
  /// tracker ← 0. With `new_scale`: scale ← new_scale (tracker unchanged). Needs a step() or unscale_()
  /// this iteration unless `new_scale` is given.
  void update(std::optional<double> new_scale = std::nullopt);

  /// The current scale (a host read); init_scale before the first scale(), 1.0 when disabled.
  double get_scale() const;
  /// Consecutive clean steps since the last growth or backoff (a host read); 0 when disabled.
  int64_t get_growth_tracker() const;
  /// Whether scaling is enabled.
  bool is_enabled() const { return enabled_; }
  /// The device of the scale tensor.
  c10::Device device() const { return device_; }
  /// Where `opt` is in the current iteration (READY if not seen since the last update()).
  OptState stage(const torch::optim::Optimizer& opt) const;

  /// Sums a found-inf flag (a 0-dim float32 tensor, in place) over data-parallel ranks that hold different
  /// gradients (ZeRO-2, where each rank holds its shard): every check of an optimizer's gradients is then
  /// agreed, so all ranks skip the same steps and back off alike (PyTorch's ShardedGradScaler all-reduces
  /// found_inf the same way). With it, an optimizer without gradients on this rank counts as clean.
  void set_found_inf_reducer(std::function<void(at::Tensor&)> reducer) { found_inf_reducer_ = std::move(reducer); }

  /// The factor applied to the scale after growth_interval clean steps.
  double get_growth_factor() const { return growth_factor_; }
  /// Sets the growth factor; > 1, else std::invalid_argument.
  void set_growth_factor(double factor);
  /// The factor applied to the scale after a step with inf/NaN gradients.
  double get_backoff_factor() const { return backoff_factor_; }
  /// Sets the backoff factor; in (0, 1), else std::invalid_argument.
  void set_backoff_factor(double factor);
  /// Consecutive clean steps before the scale grows.
  int64_t get_growth_interval() const { return growth_interval_; }
  /// Sets the growth interval; >= 1, else std::invalid_argument.
  void set_growth_interval(int64_t interval);

  /// Writes Python's state_dict entries: scale, growth_factor, backoff_factor, growth_interval,
  /// _growth_tracker (and a format version). A disabled scaler writes only the version. Call after update().
  void save(torch::serialize::OutputArchive& archive) const;
  /// Restores save()'s state (no-op when disabled). Throws std::runtime_error for a state saved by a
  /// disabled scaler, std::invalid_argument for out-of-range values.
  void load(torch::serialize::InputArchive& archive);

 private:
  struct PerOptimizerState {
    OptState stage = OptState::READY;
    std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device;  // float32 0-dim, > 0: inf/NaN seen
  };

  void check_scale_initialized(const char* funcname) const;
  /// With a found-inf reducer: `per_device` becomes one flag on the scale's device, summed over ranks.
  void agree(std::vector<std::pair<c10::Device, at::Tensor>>& per_device) const;
  std::vector<std::pair<c10::Device, at::Tensor>> unscale_grads(torch::optim::Optimizer& opt,
                                                                const at::Tensor& inv_scale,
                                                                const at::Tensor& found_inf);

  c10::Device device_;
  bool enabled_;
  double init_scale_;
  double growth_factor_;
  double backoff_factor_;
  int64_t growth_interval_;
  int64_t init_growth_tracker_ = 0;
  at::Tensor scale_;           // float32 0-dim on device_, created by the first scale()
  at::Tensor growth_tracker_;  // int32 0-dim on device_, created with scale_
  std::unordered_map<const torch::optim::Optimizer*, PerOptimizerState> per_optimizer_states_;
  std::function<void(at::Tensor&)> found_inf_reducer_;
};

}  // namespace trainkit::amp
