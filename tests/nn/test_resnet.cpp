// ResNets: parameter counts equal He et al.'s architecture counted layer by layer (ResNet-20/32/56: the
// paper's 0.27M/0.46M/0.85M) and ResNet-18's small-image variant; output shapes for 28x28 and 32x32
// inputs; option-A shortcuts pad channels with zeros; zero_init_residual makes each block the identity
// before its final ReLU; bad depths are named; `model.name = "resnet"` in the config builds it.
#include <torch/torch.h>

#include "support.h"
#include "trainkit/app/config.h"
#include "trainkit/app/run.h"
#include "trainkit/nn/resnet.h"

using namespace trainkit;
using Catch::Matchers::Contains;

namespace {

int64_t count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// He et al.'s CIFAR ResNet counted by hand: stem conv (no bias) + BN, then per stage n blocks of two 3x3
// convolutions with BN; option-A shortcuts have no parameters; the classifier 64 -> classes.
int64_t cifar_resnet_params(int64_t depth, int64_t in, int64_t classes) {
  const int64_t n = (depth - 2) / 6;
  int64_t total = 9 * in * 16 + 2 * 16;
  int64_t prev = 16;
  for (const int64_t w : {16, 32, 64}) {
    for (int64_t b = 0; b < n; ++b) {
      total += 9 * prev * w + 2 * w + 9 * w * w + 2 * w;
      prev = w;
    }
  }
  return total + 64 * classes + classes;
}

}  // namespace

TEST_CASE("ResNet parameter counts and output shapes", "[nn][resnet]") {
  CHECK(cifar_resnet_params(20, 3, 10) == 269722);
  for (const auto& [depth, paper_millions] : {std::pair<int64_t, double>{20, 0.27}, {32, 0.46}, {56, 0.85}}) {
    auto net = nn::make_cifar_resnet(nn::ResNetOptions().depth(depth));
    CHECK(count(*net) == cifar_resnet_params(depth, 3, 10));
    CHECK(std::round(count(*net) / 1e4) / 100 == Approx(paper_millions));  // the paper's table, to 2 digits
  }
  auto gray = nn::make_cifar_resnet(nn::ResNetOptions().depth(20).in_channels(1));
  CHECK(count(*gray) == cifar_resnet_params(20, 1, 10));
  CHECK(gray->forward(torch::randn({2, 1, 28, 28})).sizes() == at::IntArrayRef({2, 10}));
  auto r18 = nn::make_resnet18();
  CHECK(count(*r18) == 11173962);  // the common CIFAR ResNet-18 (3x3 stem, no max pooling)
  CHECK(r18->forward(torch::randn({2, 3, 32, 32})).sizes() == at::IntArrayRef({2, 10}));
  CHECK_THROWS_WITH(nn::make_cifar_resnet(nn::ResNetOptions().depth(21)), Contains("6n + 2") && Contains("21"));
}

TEST_CASE("ResNet blocks: option-A shortcut pads with zeros, and zero_init_residual starts at the identity",
          "[nn][resnet]") {
  torch::manual_seed(0);
  // A downsampling block whose residual branch is switched off: the output is relu(shortcut).
  nn::BasicBlock block(4, 8, 2, /*projection=*/false);
  torch::NoGradGuard no_grad;
  block->bn2->weight.zero_();
  block->bn2->bias.zero_();
  const at::Tensor x = torch::randn({1, 4, 6, 6});
  const at::Tensor y = block->forward(x);
  REQUIRE(y.sizes() == at::IntArrayRef({1, 8, 3, 3}));
  const at::Tensor sub = torch::relu(x.slice(2, 0, c10::nullopt, 2).slice(3, 0, c10::nullopt, 2));
  CHECK(torch::equal(y.slice(1, 2, 6), sub));                 // the input channels, in the middle
  CHECK(torch::equal(y.slice(1, 0, 2), torch::zeros_like(y.slice(1, 0, 2))));
  CHECK(torch::equal(y.slice(1, 6, 8), torch::zeros_like(y.slice(1, 6, 8))));

  auto net = nn::make_cifar_resnet(nn::ResNetOptions().depth(20).zero_init_residual(true));
  int64_t blocks = 0;
  for (const auto& m : net->modules(false)) {
    if (const auto* b = m->as<nn::BasicBlock>()) {
      CHECK(b->bn2->weight.abs().sum().item<double>() == 0.0);
      CHECK(b->bn1->weight.min().item<double>() == 1.0);
      ++blocks;
    }
  }
  CHECK(blocks == 9);
}

TEST_CASE("config: model.name = \"resnet\" with model.depth builds the CIFAR ResNet for 1-channel images",
          "[nn][resnet][config]") {
  const auto c = app::parse_config("[model]\nname = \"resnet\"\ndepth = 32\nzero_init_residual = true\n", "c.toml");
  const auto& keys = app::ImageModelOptions::binding();
  CHECK(app::read_extra(c, "model", keys).resnet().depth() == 32);
  CHECK(app::read_extra(c, "model", keys).resnet().zero_init_residual());
  CHECK(app::read_extra(app::Config(), "model", keys).resnet().depth() == 20);
  CHECK_THROWS_MATCHES(app::parse_config("[model]\ndepth = 21\n", "c.toml"), app::ConfigError,
                       trainkit::test::WhatContains("c.toml: model.depth: expected an integer 6n + 2"));
  app::Run run = app::build_run(app::parse_config("", "test.toml",
                                                  {"data.limit_train=100", "data.limit_test=50", "data.val_size=50",
                                                   "train.batch_size=25", "model.name=\"resnet\"", "model.depth=8",
                                                   "train.device=\"cpu\""}),
                                "test.toml");
  CHECK(count(*run.model) == cifar_resnet_params(8, 1, 10));
  run.train->set_epoch(0);
  const auto batch = run.train->next();
  REQUIRE(batch.has_value());
  CHECK(std::isfinite(run.trainer->train_step(*batch).item<double>()));
}
