#pragma once
/// @file
/// The hook through which amp::GradScaler hands the gradient unscale factor and the overflow flag to a
/// fused optimizer, so that no separate unscale pass over the gradients is needed (PyTorch's fused
/// optimizers take `grad_scale` and `found_inf` for the same reason).

namespace at {
class Tensor;
}

namespace trainkit::optim {

/// An optimizer that can unscale gradients inside its own step.
class ScaledStep {
 public:
  virtual ~ScaledStep() = default;
  /// One step as if every gradient were first multiplied by `inv_scale` (0-dim float tensor); the
  /// gradients themselves are left as they are. Does nothing when `found_inf` (0-dim float) is non-zero.
  virtual void step_scaled(const at::Tensor& inv_scale, const at::Tensor& found_inf) = 0;
  /// Whether every param group steps through a kernel that takes the scale and `found_inf` on the device
  /// (ATen's fused kernels), so that the skip decision needs no host read.
  virtual bool takes_found_inf() const { return false; }
  /// One step of the gradients divided by `grad_scale` (0-dim float; undefined: already unscaled), skipped
  /// on the device, parameters and state untouched, where `found_inf` (0-dim float) is non-zero. Only when
  /// takes_found_inf(); otherwise std::logic_error.
  virtual void step_found_inf(const at::Tensor& grad_scale, const at::Tensor& found_inf) = 0;
};

}  // namespace trainkit::optim
