#pragma once
// The small separable 3-class problem that the Trainer tests train on.

#include <cstdint>

#include <torch/torch.h>

#include "trainkit/data/tensor_loader.h"

namespace trainkit::test {

/// n samples of 16 features whose label is the argmax of the first 3; batches of 8 in an order seeded by
/// `seed` (the data itself is always the same).
inline data::TensorLoader toy_loader(uint64_t seed, int64_t n = 96) {
  torch::manual_seed(1234);
  const at::Tensor x = torch::randn({n, 16});
  const at::Tensor y = x.narrow(1, 0, 3).argmax(1);
  return data::TensorLoader(x, y, data::TensorLoaderOptions().batch_size(8).seed(seed));
}

}  // namespace trainkit::test
