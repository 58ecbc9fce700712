#pragma once
// The state of a device's default generator, read and written under the generator's lock: shared by
// activation checkpointing (fork_rng) and the Trainer's checkpoints.

#include <mutex>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

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

}  // namespace trainkit::detail
