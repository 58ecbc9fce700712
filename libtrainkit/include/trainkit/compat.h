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
