#pragma once
// The model, data and training loop shared by the multi-process worker (tests/dist/dist_worker.cpp) and
// the single-process references in tests/dist/test_ddp.cpp, so both compute the same thing.

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "trainkit/optim/adam.h"
#include "trainkit/optim/lamb.h"
#include "trainkit/optim/param_groups.h"

namespace trainkit::test::dist {

/// Many small float64 tensors (13 Linear layers): with a small bucket cap they span several buckets.
struct ChainNet : torch::nn::Module {
  explicit ChainNet(int64_t depth = 12) {
    for (int64_t i = 0; i < depth; ++i) {
      layers.push_back(register_module("layer" + std::to_string(i), torch::nn::Linear(8, 8)));
    }
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& l : layers) x = torch::tanh(l->forward(x));
    return head->forward(x);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear head{nullptr};
};

/// The net initialised from `seed`, in float64.
inline std::shared_ptr<ChainNet> make_chain_net(uint64_t seed) {
  torch::manual_seed(seed);
  auto net = std::make_shared<ChainNet>();
  net->to(torch::kFloat64);
  return net;
}

/// The fixed model and data of the "metrics" mode: 46 samples (23 per rank of 2, so no shard is padded).
struct MetricsProblem {
  at::Tensor x, y;
  MetricsProblem() {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(77);
    x = torch::randn({46, 5}, gen);
    y = torch::randint(0, 3, {46}, gen, torch::TensorOptions().dtype(torch::kInt64));
  }
  torch::nn::Linear model() const {
    torch::manual_seed(5);
    return torch::nn::Linear(5, 3);
  }
};

/// `n` float64 inputs of width 8 and class targets in [0, 3), fixed by the seed.
inline std::pair<at::Tensor, at::Tensor> make_data(int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  at::Tensor x = torch::randn({n, 8}, gen, torch::TensorOptions().dtype(torch::kFloat64));
  at::Tensor y = torch::randint(0, 3, {n}, gen, torch::TensorOptions().dtype(torch::kInt64));
  return {x, y};
}

/// Rows of micro-batch `k` of rank `rank` in step `step`: the global batch of a step is
/// world * accum * micro rows, laid out micro-batch by micro-batch, rank by rank.
inline at::Tensor rows(const at::Tensor& t, int64_t step, int64_t k, int64_t rank, int64_t world, int64_t accum,
                       int64_t micro) {
  const int64_t global = world * accum * micro;
  return t.narrow(0, step * global + (k * world + rank) * micro, micro);
}

/// Copies of every parameter.
inline std::vector<at::Tensor> snapshot(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

/// The layer-decay param groups of the ZeRO tests over `net` (a ChainNet: 13 layers by its children): LR
/// 1e-2 x 0.75^(12 - layer), weight decay 0.05 for the weights and 0 for the biases, for trainkit's AdamW;
/// 26 groups of one tensor, so each rank owns nothing of most of them.
inline std::vector<torch::optim::OptimizerParamGroup> make_layer_decay_groups(const torch::nn::Module& net) {
  const auto groups = trainkit::optim::layer_decay_groups(
      net.named_parameters(), trainkit::optim::child_layer_ids(net),
      trainkit::optim::LayerDecayOptions().layer_decay(0.75).weight_decay(0.05));
  return trainkit::optim::to_param_groups(groups, trainkit::optim::AdamWOptions(1e-2));
}

/// trainkit's AdamW over param groups that carry their options (the ZeRO tests' grouped factory).
inline std::unique_ptr<torch::optim::Optimizer> make_layer_decay_optimizer(
    std::vector<torch::optim::OptimizerParamGroup> groups) {
  return std::make_unique<trainkit::optim::AdamW>(groups, trainkit::optim::AdamWOptions(1e-2));
}

/// The optimizers of the ZeRO tests by name: "adam", "adamw", "sgd" (momentum 0.9) or "lamb" (weight decay
/// 0.01, no internal clip: the test clips with the norm over all ranks).
inline std::unique_ptr<torch::optim::Optimizer> make_zero_test_optimizer(const std::string& name,
                                                                        std::vector<at::Tensor> params) {
  if (name == "adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
  if (name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
  }
  if (name == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  if (name == "lamb") {
    return std::make_unique<trainkit::optim::Lamb>(
        params, trainkit::optim::LambOptions(1e-2).weight_decay(0.01).max_grad_norm(std::nullopt));
  }
  throw std::invalid_argument("unknown test optimizer '" + name + "'");
}

constexpr int64_t kMicro = 6;
constexpr double kLr = 0.1;

}  // namespace trainkit::test::dist
