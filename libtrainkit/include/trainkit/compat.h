#pragma once
/// @file
/// Every difference between the LibTorch versions trainkit supports (>= 2.4; tested with 2.4.1 and 2.15.0 by
/// scripts/compat.sh) lives here.

#include <torch/version.h>

/// True when the LibTorch being compiled against is at least MAJOR.MINOR.
#define TRAINKIT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// The oldest release tested is 2.4.1. 2.1.2 does not compile: trainkit passes std::optional where LibTorch 2.1
// has a c10::optional class of its own (2.3 made it an alias of std::optional), and more (docs/testing.md,
// "Tested LibTorch versions").
static_assert(TRAINKIT_TORCH_AT_LEAST(2, 4), "trainkit needs LibTorch >= 2.4");

#include <string>

namespace trainkit::compat {

/// The LibTorch version trainkit was compiled against, as "MAJOR.MINOR.PATCH".
inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

}  // namespace trainkit::compat

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

namespace trainkit::compat {

/// The owning pointer to an autograd graph node, as `torch::autograd::impl::grad_accumulator` returns it:
/// std::shared_ptr in older releases (2.4), c10::intrusive_ptr in newer ones.
using AutogradNodePtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::autograd::Variable&>()));

namespace detail {
template <class Options, class = void>
struct has_create_default : std::false_type {};
template <class Options>
struct has_create_default<Options, std::void_t<decltype(Options::create_default(std::chrono::milliseconds{}))>>
    : std::true_type {};
}  // namespace detail

/// Gloo backend options with the default devices: the interfaces named in GLOO_SOCKET_IFNAME (comma-separated),
/// else the address this machine's host name resolves to. `ProcessGroupGloo::Options::create_default` where
/// LibTorch has it; in older releases (2.4) the same steps as that release's Python binding of the
/// ProcessGroupGloo constructor. A template over c10d's class, so that this header needs no c10d (or Gloo)
/// header: src/dist/process_group.cpp, the one source that includes them, instantiates it.
template <class ProcessGroupGloo>
auto gloo_default_options(std::chrono::milliseconds timeout) {
  using Options = typename ProcessGroupGloo::Options;
  if constexpr (detail::has_create_default<Options>::value) {
    return Options::create_default(timeout);
  } else {
    auto options = Options::create(timeout);
    const char* ifnames = std::getenv("GLOO_SOCKET_IFNAME");
    if (ifnames != nullptr && ifnames[0] != '\0') {
      std::istringstream list(ifnames);
      for (std::string name; std::getline(list, name, ',');) {
        options->devices.push_back(ProcessGroupGloo::createDeviceForInterface(name));
      }
    } else {
      options->devices.push_back(ProcessGroupGloo::createDefaultDevice());
    }
    options->threads = static_cast<int>(options->devices.size() * 2);
    return options;
  }
}

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

#include <c10/core/Device.h>
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

/// Waits until everything queued on `device` has run: the device-generic
/// `DeviceGuardImplInterface::synchronizeDevice` where LibTorch has it (newer than 2.4); before, CUDA through
/// `torch::cuda::synchronize` and std::invalid_argument for other devices.
void synchronize_device(const c10::Device& device);

}  // namespace trainkit::compat

// The definitions below need <ATen/autocast_mode.h>, which costs ~20 s of parsing per translation unit;
// they are compiled once, in src/compat.cpp, which defines TRAINKIT_COMPAT_IMPLEMENTATION. They stay in
// this header so that every version difference is in one place.
#ifdef TRAINKIT_COMPAT_IMPLEMENTATION
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <stdexcept>

namespace trainkit::compat {

/// Whether autocast is enabled for `device` in this thread.
bool autocast_enabled(c10::DeviceType device) {
  return at::autocast::is_autocast_enabled(device);
}

/// Enables or disables autocast for `device` in this thread.
void set_autocast_enabled(c10::DeviceType device, bool enabled) {
  at::autocast::set_autocast_enabled(device, enabled);
}

/// The lower-precision dtype autocast casts to on `device` in this thread.
c10::ScalarType autocast_dtype(c10::DeviceType device) {
  return at::autocast::get_autocast_dtype(device);
}

/// Sets the lower-precision dtype autocast casts to on `device` in this thread.
void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(device, dtype);
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

namespace detail {
// Whether DeviceGuardImplInterface has synchronizeDevice (detected, as the release that added it is not pinned
// down here: 2.4 lacks it, 2.15 has it).
template <class Impl, class = void>
struct has_synchronize_device : std::false_type {};
template <class Impl>
struct has_synchronize_device<Impl, std::void_t<decltype(std::declval<const Impl&>().synchronizeDevice(
                                        c10::DeviceIndex{}))>> : std::true_type {};

template <class Impl>
void synchronize_device(const Impl* impl, const c10::Device& device) {
  if constexpr (has_synchronize_device<Impl>::value) {
    impl->synchronizeDevice(device.index());
  } else {
    (void)impl;
    if (!device.is_cuda()) {
      throw std::invalid_argument("synchronizing " + device.str() +
                                  " needs a newer LibTorch (DeviceGuardImplInterface::synchronizeDevice); this is " +
                                  torch_version());
    }
    torch::cuda::synchronize(device.index());
  }
}
}  // namespace detail

/// Waits until everything queued on `device` has run.
void synchronize_device(const c10::Device& device) {
  detail::synchronize_device(c10::impl::getDeviceGuardImpl(device.type()), device);
}

}  // namespace trainkit::compat

#endif  // TRAINKIT_COMPAT_IMPLEMENTATION
