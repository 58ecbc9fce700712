#pragma once
// The state of a device's default generator, read and written under the generator's lock: shared by
// activation checkpointing (fork_rng), the Trainer's checkpoints and the finders' snapshots.

#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/core/Generator.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <torch/cuda.h>

namespace trainkit::detail {

/// The state of the default generator of `device`.
inline at::Tensor rng_state(const c10::Device& device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

/// Sets the default generator of `device` to `state`.
inline void set_rng_state(const c10::Device& device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

/// The device types besides the CPU whose generators a run may draw from, each with its device count: CUDA
/// (every visible device, as torch.cuda.get_rng_state_all) and the process's accelerator when it is another
/// one (an out-of-tree PrivateUse1 backend, XPU, MPS ...). Types without a device are left out.
inline std::vector<std::pair<c10::DeviceType, int64_t>> generator_device_types() {
  std::vector<std::pair<c10::DeviceType, int64_t>> out;
  const auto cuda = static_cast<int64_t>(torch::cuda::device_count());
  if (cuda > 0) {
    out.emplace_back(c10::DeviceType::CUDA, cuda);
  }
  const std::optional<c10::DeviceType> accelerator = at::getAccelerator(/*checked=*/false);
  if (accelerator && *accelerator != c10::DeviceType::CUDA) {
    const auto count = static_cast<int64_t>(at::globalContext().getAcceleratorHooksInterface(*accelerator).deviceCount());
    if (count > 0) {
      out.emplace_back(*accelerator, count);
    }
  }
  return out;
}

/// The state of every default generator: the CPU's first, then every device of generator_device_types().
inline std::vector<std::pair<c10::Device, at::Tensor>> all_rng_states() {
  std::vector<std::pair<c10::Device, at::Tensor>> out;
  out.emplace_back(c10::Device(c10::kCPU), rng_state(c10::Device(c10::kCPU)));
  for (const auto& [type, count] : generator_device_types()) {
    for (int64_t i = 0; i < count; ++i) {
      const c10::Device device(type, static_cast<c10::DeviceIndex>(i));
      out.emplace_back(device, rng_state(device));
    }
  }
  return out;
}

/// Sets each generator of `states` (from all_rng_states()) back.
inline void set_all_rng_states(const std::vector<std::pair<c10::Device, at::Tensor>>& states) {
  for (const auto& [device, state] : states) {
    set_rng_state(device, state);
  }
}

}  // namespace trainkit::detail
