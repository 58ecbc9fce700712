#include "trainkit/data/torch_data.h"

#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

namespace trainkit::data {

ScopedSeed::ScopedSeed(uint64_t seed) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  saved_ = gen.get_state();
  gen.set_current_seed(seed);
}

ScopedSeed::~ScopedSeed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(saved_);
}

}  // namespace trainkit::data
