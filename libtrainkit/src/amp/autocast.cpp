#include "trainkit/amp/autocast.h"

#include <stdexcept>
#include <string>

#include <c10/core/Device.h>
#include <fmt/format.h>

#include "trainkit/compat.h"

namespace trainkit::amp {

bool is_autocast_dtype_supported(c10::DeviceType device, c10::ScalarType dtype) {
  switch (device) {
    case c10::DeviceType::CPU:
      // Python's CPU autocast accepts float16 since the release whose docs added it (2.5).
#if TRAINKIT_TORCH_AT_LEAST(2, 5)
      return dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Half;
#else
      return dtype == c10::ScalarType::BFloat16;
#endif
    case c10::DeviceType::CUDA:
      return dtype == c10::ScalarType::Half || dtype == c10::ScalarType::BFloat16;
    default:
      return false;
  }
}

namespace {

std::string supported_list(c10::DeviceType device) {
  std::string out;
  for (const auto dtype : {c10::ScalarType::BFloat16, c10::ScalarType::Half}) {
    if (is_autocast_dtype_supported(device, dtype)) {
      out += (out.empty() ? "" : ", ") + std::string(c10::toString(dtype));
    }
  }
  return out.empty() ? "none" : out;
}

}  // namespace

Autocast::Autocast(c10::DeviceType device, c10::ScalarType dtype, bool enabled, std::optional<bool> cache_enabled)
    : device_(device), dtype_(dtype), enabled_(enabled) {
  if (device != c10::DeviceType::CPU && device != c10::DeviceType::CUDA) {
    throw std::invalid_argument(fmt::format("Autocast: unsupported device type {} (trainkit drives cpu and cuda)",
                                            c10::DeviceTypeName(device, true)));
  }
  if (enabled && !is_autocast_dtype_supported(device, dtype)) {
    throw std::invalid_argument(fmt::format("Autocast: unsupported dtype {} on {} (supported: {})",
                                            c10::toString(dtype), c10::DeviceTypeName(device, true),
                                            supported_list(device)));
  }
  prev_enabled_ = compat::autocast_enabled(device);
  prev_dtype_ = compat::autocast_dtype(device);
  prev_cache_enabled_ = compat::autocast_cache_enabled();
  compat::set_autocast_enabled(device, enabled);
  compat::set_autocast_dtype(device, dtype);
  compat::autocast_increment_nesting();
  compat::set_autocast_cache_enabled(cache_enabled.value_or(prev_cache_enabled_));
}

Autocast::~Autocast() {
  // The cache holds lower-precision copies of leaf tensors (weights); it must not outlive the outermost region.
  if (compat::autocast_decrement_nesting() == 0) {
    compat::autocast_clear_cache();
  }
  compat::set_autocast_enabled(device_, prev_enabled_);
  compat::set_autocast_dtype(device_, prev_dtype_);
  compat::set_autocast_cache_enabled(prev_cache_enabled_);
}

at::Tensor loss_for_backward(const at::Tensor& loss) {
  const auto t = loss.scalar_type();
  return t == c10::ScalarType::Half || t == c10::ScalarType::BFloat16 ? loss.to(c10::ScalarType::Float) : loss;
}

}  // namespace trainkit::amp
