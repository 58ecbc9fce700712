#pragma once
/// @file
/// Every difference between the LibTorch versions trainkit supports (>= 2.1) lives here.

#include <torch/version.h>

/// True when the LibTorch being compiled against is at least MAJOR.MINOR.
#define TRAINKIT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

static_assert(TRAINKIT_TORCH_AT_LEAST(2, 1), "trainkit needs LibTorch >= 2.1");

#include <string>

namespace trainkit::compat {

/// The LibTorch version trainkit was compiled against, as "MAJOR.MINOR.PATCH".
inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

}  // namespace trainkit::compat

#include <sstream>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace trainkit::compat {

/// The key type of `torch::optim::Optimizer::state()`: the TensorImpl pointer as a string in old
/// releases, as `void*` in newer ones.
using ParamStateKey = typename std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

/// The key under which an optimizer keeps the state of parameter `p`.
template <class Key = ParamStateKey>
Key param_state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

}  // namespace trainkit::compat

#include <torch/csrc/autograd/variable.h>

namespace trainkit::compat {

/// An owning pointer to an autograd graph node (a parameter's grad accumulator): `std::shared_ptr<Node>` in
/// older releases (2.11 among them), `c10::intrusive_ptr<Node>` in newer ones; taken from what
/// `grad_accumulator` returns, so no version number needs naming.
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

}  // namespace trainkit::compat

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace trainkit::compat {

/// Whether autocast is enabled for `device` in this thread.
bool autocast_enabled(c10::DeviceType device);
/// Enables or disables autocast for `device` in this thread.
void set_autocast_enabled(c10::DeviceType device, bool enabled);
/// The lower-precision dtype autocast casts to on `device` in this thread.
c10::ScalarType autocast_dtype(c10::DeviceType device);
/// Sets the lower-precision dtype autocast casts to on `device` in this thread.
void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype);
/// Whether autocast caches the lower-precision casts of leaf tensors (weights) within a region.
bool autocast_cache_enabled();
/// Turns autocast's cast cache on or off in this thread.
void set_autocast_cache_enabled(bool enabled);
/// Enters one autocast nesting level; returns the new depth.
int autocast_increment_nesting();
/// Leaves one autocast nesting level; returns the new depth (0: outside every autocast region).
int autocast_decrement_nesting();
/// Drops autocast's cast cache (Python's torch.autocast does this when the outermost region exits).
void autocast_clear_cache();

}  // namespace trainkit::compat

// The definitions below need <ATen/autocast_mode.h>, which costs ~20 s of parsing per translation unit;
// they are compiled once, in src/compat.cpp, which defines TRAINKIT_COMPAT_IMPLEMENTATION. They stay in
// this header so that every version difference is in one place.
#ifdef TRAINKIT_COMPAT_IMPLEMENTATION
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <stdexcept>

namespace trainkit::compat {

// Autocast state per device type: one device-generic API from 2.4; before, CPU and CUDA had their own
// functions (the other backends too, which trainkit does not drive).
#if !TRAINKIT_TORCH_AT_LEAST(2, 4)
namespace detail {
inline void check_autocast_device(c10::DeviceType device) {
  if (device != c10::DeviceType::CPU && device != c10::DeviceType::CUDA) {
    throw std::invalid_argument(std::string("autocast before LibTorch 2.4: only CPU and CUDA are supported, got ") +
                                c10::DeviceTypeName(device));
  }
}
}  // namespace detail
#endif

/// Whether autocast is enabled for `device` in this thread.
bool autocast_enabled(c10::DeviceType device) {
#if TRAINKIT_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  detail::check_autocast_device(device);
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

/// Enables or disables autocast for `device` in this thread.
void set_autocast_enabled(c10::DeviceType device, bool enabled) {
#if TRAINKIT_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
#else
  detail::check_autocast_device(device);
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

/// The lower-precision dtype autocast casts to on `device` in this thread.
c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if TRAINKIT_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  detail::check_autocast_device(device);
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
}

/// Sets the lower-precision dtype autocast casts to on `device` in this thread.
void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
#if TRAINKIT_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device, dtype);
#else
  detail::check_autocast_device(device);
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

/// Whether autocast caches the lower-precision casts of leaf tensors (weights) within a region.
bool autocast_cache_enabled() { return at::autocast::is_autocast_cache_enabled(); }

/// Turns autocast's cast cache on or off in this thread.
void set_autocast_cache_enabled(bool enabled) { at::autocast::set_autocast_cache_enabled(enabled); }

/// Enters one autocast nesting level; returns the new depth.
int autocast_increment_nesting() { return at::autocast::increment_nesting(); }

/// Leaves one autocast nesting level; returns the new depth (0: outside every autocast region).
int autocast_decrement_nesting() { return at::autocast::decrement_nesting(); }

/// Drops autocast's cast cache (Python's torch.autocast does this when the outermost region exits).
void autocast_clear_cache() { at::autocast::clear_cache(); }

}  // namespace trainkit::compat

#endif  // TRAINKIT_COMPAT_IMPLEMENTATION
