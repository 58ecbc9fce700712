#pragma once
// The small separable 3-class problem that the Trainer tests train on.

#include <cstdint>

#include <torch/torch.h>

#include "trainkit/data/tensor_loader.h"
#include "trainkit/nn/models.h"
#include "trainkit/train/trainer.h"

namespace trainkit::test {

/// n samples of 16 features whose label is the argmax of the first 3; batches of 8 in an order seeded by
/// `seed` (the data itself is always the same).
inline data::TensorLoader toy_loader(uint64_t seed, int64_t n = 96) {
  torch::manual_seed(1234);
  const at::Tensor x = torch::randn({n, 16});
  const at::Tensor y = x.narrow(1, 0, 3).argmax(1);
  return data::TensorLoader(x, y, data::TensorLoaderOptions().batch_size(8).seed(seed));
}

/// An MLP for the toy problem (16 → 32 → 3, dropout 0.2) initialized from `init_seed`, its Adam at `lr` and a
/// Trainer with `options`.
struct ToySetup {
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::unique_ptr<train::Trainer> trainer;

  ToySetup(uint64_t init_seed, train::TrainerOptions options, double lr = 1e-2) {
    torch::manual_seed(init_seed);
    model = nn::make_mlp(nn::MlpOptions().in_features(16).hidden({32}).dropout(0.2).num_classes(3));
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(lr));
    trainer = std::make_unique<train::Trainer>(model, *optimizer, options);
  }
};

}  // namespace trainkit::test
