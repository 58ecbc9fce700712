#pragma once
// A device backend for process-group tests that refuses CPU tensors as NCCL does: a c10d::Backend wrapped
// around Gloo that throws on any CPU tensor ("Tensors must be CUDA and dense", NCCL's words) and hands every
// other tensor (testdev's host memory, through a CPU alias) to the Gloo inside, counting the calls it served.
// Registered as "refuse_cpu": InitOptions().backend("testdev:refuse_cpu") is then a group shaped like
// backend = "nccl" (Gloo for CPU tensors, this for the device's). Its source is the only test source that
// includes c10d's headers (built like libtrainkit's process_group.cpp, without trainkit's fmt shim).

#include <cstdint>

namespace trainkit::test::dist {

/// Registers "refuse_cpu" with trainkit::dist::register_backend (once; later calls do nothing).
void register_refusing_backend();

/// Collectives of device tensors the backend served in this process.
int64_t refusing_backend_served();

/// Collectives it refused because a CPU tensor reached it (each also threw).
int64_t refusing_backend_refused();

}  // namespace trainkit::test::dist
