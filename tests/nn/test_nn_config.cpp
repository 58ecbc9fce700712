// model.checkpoint_segments and model.init in the config: parsed, validated, and used by build_run (a
// checkpointed run takes bitwise the steps of the plain one; an init scheme changes the weights).
#include <set>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/app/config.h"
#include "trainkit/app/run.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;
using trainkit::test::WhatContains;

namespace {

app::Run small_cnn_run(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"data.limit_train=200", "data.limit_test=50", "data.val_size=50",
                                  "train.batch_size=50", "model.channels=[4, 8]", "model.hidden=16",
                                  "train.device=\"cpu\""};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return app::build_run(app::parse_config("", "test.toml", all), "test.toml");
}

/// Nodes of the autograd graph behind `output` whose name contains `name` (each node counted once).
int64_t count_graph_nodes(const at::Tensor& output, const std::string& name) {
  std::vector<torch::autograd::Node*> stack{output.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int64_t count = 0;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) {
      continue;
    }
    count += node->name().find(name) != std::string::npos ? 1 : 0;
    for (const auto& edge : node->next_edges()) {
      stack.push_back(edge.function.get());
    }
  }
  return count;
}

}  // namespace

TEST_CASE("config: model.checkpoint_segments and model.init are parsed and checked", "[nn][config]") {
  const auto c = app::parse_config("[model]\ncheckpoint_segments = 3\ninit = \"xavier_uniform\"\n", "c.toml");
  CHECK(c.model.checkpoint_segments == 3);
  CHECK(c.model.init == "xavier_uniform");
  CHECK(app::Config().model.checkpoint_segments == 0);
  CHECK(app::Config().model.init == "default");
  CHECK_THROWS_MATCHES(app::parse_config("[model]\ncheckpoint_segments = -1\n", "c.toml"), app::ConfigError,
                       WhatContains("model.checkpoint_segments"));
  CHECK_THROWS_MATCHES(app::parse_config("[model]\ninit = \"he\"\n", "c.toml"), app::ConfigError,
                       WhatContains("lecun_normal"));
}

TEST_CASE("build_run: checkpointed training takes bitwise the plain run's steps", "[nn][config][checkpoint]") {
  app::Run plain = small_cnn_run({});
  app::Run ckpt = small_cnn_run({"model.checkpoint_segments=3"});
  plain.train->set_epoch(0);
  ckpt.train->set_epoch(0);
  for (int i = 0; i < 2; ++i) {
    const auto a = plain.train->next();
    const auto b = ckpt.train->next();
    REQUIRE(a.has_value());
    REQUIRE(b.has_value());
    torch::manual_seed(100 + i);  // the same dropout masks for both runs (they share the global generator)
    const double la = plain.trainer->train_step(*a).item<double>();
    torch::manual_seed(100 + i);
    const double lb = ckpt.trainer->train_step(*b).item<double>();
    REQUIRE(la == lb);
  }
  const auto pa = plain.model->parameters();
  const auto pb = ckpt.model->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(torch::equal(pa[i], pb[i]));
  }
  // The run's forward is checkpointed: as PyTorch's checkpoint_sequential, every segment but the last is a
  // checkpoint node of the output's autograd graph (each recomputes its segment in backward); the plain
  // run's graph has none.
  const auto batch = ckpt.train->next();
  REQUIRE(batch.has_value());
  CHECK(count_graph_nodes(ckpt.trainer->forward_fn()(*batch), "CheckpointNode") == 2);
  CHECK(count_graph_nodes(plain.trainer->forward_fn()(*batch), "CheckpointNode") == 0);
  REQUIRE_THROWS_MATCHES(small_cnn_run({"model.checkpoint_segments=99"}), app::ConfigError,
                         WhatContains("at most the model's"));
}

TEST_CASE("build_run: model.init applies its scheme", "[nn][config][init]") {
  app::Run lecun = small_cnn_run({"model.init=\"lecun_normal\""});
  app::Run plain = small_cnn_run({});
  const at::Tensor w = lecun.model->named_parameters()["4.weight"];  // second conv, 8 x 4 x 3 x 3
  CHECK_FALSE(torch::equal(w, plain.model->named_parameters()["4.weight"]));
  CHECK(lecun.model->named_parameters()["10.bias"].abs().sum().item<double>() == 0.0);  // the hidden linear
}
