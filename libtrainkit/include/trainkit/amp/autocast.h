#pragma once
/// @file
/// An RAII autocast region with the semantics of Python's `torch.autocast(device_type, dtype, enabled)`:
/// ops in the region run in the lower-precision dtype where autocast's op lists say so, and leaving the
/// region restores the previous state, so regions nest.

#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace trainkit::amp {

/// Whether autocast on `device` can use `dtype`: CPU takes bfloat16 (and float16 from LibTorch 2.5),
/// CUDA float16 and bfloat16; other devices are not supported.
bool is_autocast_dtype_supported(c10::DeviceType device, c10::ScalarType dtype);

/// A loss computed under autocast, as it is reported and backpropagated: float16 and bfloat16 become float32
/// (where autocast ran the loss's last op in the lower precision); float32 and float64 stay as they are.
/// The Trainer and the LR finder both take their loss through it.
at::Tensor loss_for_backward(const at::Tensor& loss);

/// Autocast for one device type while the object lives (thread-local, like all autocast state).
///
/// Construction saves the device's enabled flag, its autocast dtype and the cast-cache flag, then sets
/// them; destruction restores them and, when it leaves the outermost region, clears the cast cache
/// (Python's `__enter__`/`__exit__`). A guard with `enabled = false` inside an enabled one turns autocast
/// off until it is destroyed. Usage:
///
///     {
///       trainkit::amp::Autocast autocast(torch::kCPU, torch::kBFloat16);
///       auto loss = loss_fn(model->forward(x), y);   // matmuls in bfloat16
///     }
///     scaler.scale(loss).backward();                 // backward outside the region, as in PyTorch
class Autocast {
 public:
  /// Enters the region. With `enabled`, `dtype` must satisfy is_autocast_dtype_supported(), else
  /// std::invalid_argument naming the dtype; a disabled guard accepts any dtype, as Python does.
  /// `cache_enabled` defaults to the current cache flag (Python's `cache_enabled=None`).
  Autocast(c10::DeviceType device, c10::ScalarType dtype, bool enabled = true,
           std::optional<bool> cache_enabled = std::nullopt);
  /// Leaves the region: restores the saved state; clears the cast cache when no region is left.
  ~Autocast();

  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;
  Autocast(Autocast&&) = delete;
  Autocast& operator=(Autocast&&) = delete;

  /// The device type this guard controls.
  c10::DeviceType device() const { return device_; }
  /// The autocast dtype set by this guard.
  c10::ScalarType dtype() const { return dtype_; }
  /// Whether this guard enabled (true) or disabled (false) autocast.
  bool enabled() const { return enabled_; }

 private:
  c10::DeviceType device_;
  c10::ScalarType dtype_;
  bool enabled_;
  bool prev_enabled_;
  c10::ScalarType prev_dtype_;
  bool prev_cache_enabled_;
};

}  // namespace trainkit::amp
