// Layer-wise LR decay against timm (tests/golden/layer_decay.toml, scripts/golden_layer_decay.py): the layer
// ids timm's group_parameters gives a ViT and a ResNet from their group_matcher, and the param groups of
// param_groups_layer_decay (names, LR scales, weight decays, members in order); and LRs by parameter name.
#include <torch/torch.h>

#include "support.h"
#include "trainkit/optim/adam.h"
#include "trainkit/optim/param_groups.h"
#include "trainkit/optim/sgd.h"

using namespace trainkit;

using trainkit::test::values_of;
using trainkit::test::WhatContains;

TEST_CASE("layer_ids and layer_decay_groups follow timm's param_groups_layer_decay", "[optim][layer_decay][golden]") {
  const auto& g = trainkit::test::golden("layer_decay.toml");
  for (const auto& node : *g["case"].as_array()) {
    const auto& c = *node.as_table();
    DYNAMIC_SECTION(c["model"].value<std::string>().value()) {
      std::vector<std::vector<optim::LayerRule>> matcher;
      for (const auto& group : *c["matcher"].as_array()) {
        std::vector<optim::LayerRule> rules;
        for (const auto& rule : *group.as_array()) {
          const auto& pair = *rule.as_array();
          rules.push_back({pair[0].value<std::string>().value(), values_of<double>(pair[1])});
        }
        matcher.push_back(rules);
      }
      const std::vector<std::string> names = values_of<std::string>(*c["names"].as_array());
      const auto& ndims = *c["ndims"].as_array();
      const auto& want_ids = *c["layer_ids"].as_array();
      const auto ids = optim::layer_ids(names, matcher);
      torch::OrderedDict<std::string, at::Tensor> params;
      for (size_t i = 0; i < names.size(); ++i) {
        INFO(names[i]);
        CHECK(ids.at(names[i]) == want_ids[i].value<int64_t>().value());
        const auto ndim = static_cast<size_t>(ndims[i].value<int64_t>().value());
        params.insert(names[i], torch::zeros(std::vector<int64_t>(ndim, 1)).requires_grad_());
      }
      const auto groups = optim::layer_decay_groups(params, ids,
                                                    optim::LayerDecayOptions()
                                                        .weight_decay(c["weight_decay"].value<double>().value())
                                                        .layer_decay(c["layer_decay"].value<double>().value())
                                                        .min_scale(c["min_scale"].value<double>().value())
                                                        .no_weight_decay(values_of<std::string>(*c["no_weight_decay"].as_array())));
      const auto scales = values_of<double>(*c["group_lr_scales"].as_array());
      const auto decays = values_of<double>(*c["group_weight_decays"].as_array());
      const auto& members = *c["group_params"].as_array();
      REQUIRE(groups.size() == scales.size());
      for (size_t i = 0; i < groups.size(); ++i) {
        INFO("group " << groups[i].name);
        CHECK(groups[i].lr_scale == Approx(scales[i]).epsilon(1e-14));
        CHECK(groups[i].weight_decay == decays[i]);
        CHECK(groups[i].param_names == values_of<std::string>(*members.get(i)));
        REQUIRE(groups[i].params.size() == groups[i].param_names.size());
        CHECK(groups[i].params.front().is_same(params[groups[i].param_names.front()]));
      }
    }
  }
}

TEST_CASE("to_param_groups scales each group's LR and sets its weight decay", "[optim][layer_decay]") {
  torch::OrderedDict<std::string, at::Tensor> params;
  params.insert("stem.weight", torch::zeros({2, 2}).requires_grad_());
  params.insert("blocks.0.weight", torch::zeros({2, 2}).requires_grad_());
  params.insert("blocks.0.bias", torch::zeros({2}).requires_grad_());
  params.insert("blocks.1.weight", torch::zeros({2, 2}).requires_grad_());
  params.insert("head.weight", torch::zeros({2, 2}).requires_grad_());
  params.insert("frozen.weight", torch::zeros({2, 2}));
  const auto ids = optim::layer_ids(params.keys(), {{{"^stem"}}, {{"^blocks\\.(\\d+)"}}});
  CHECK(ids.at("stem.weight") == 0);
  CHECK(ids.at("blocks.0.bias") == 1);
  CHECK(ids.at("blocks.1.weight") == 2);
  CHECK(ids.at("head.weight") == 3);  // unmatched: the last layer
  const auto groups = optim::layer_decay_groups(params, ids, optim::LayerDecayOptions().layer_decay(0.5).weight_decay(0.1));
  REQUIRE(groups.size() == 5);  // the frozen parameter is left out
  optim::AdamW opt(optim::to_param_groups(groups, optim::AdamWOptions(0.8)), optim::AdamWOptions(0.8));
  const std::vector<double> lrs{0.1, 0.2, 0.2, 0.4, 0.8};  // 0.8 x 0.5^(3 - layer)
  const std::vector<double> wds{0.1, 0.1, 0.0, 0.1, 0.1};  // the 1-D bias has none
  for (size_t i = 0; i < lrs.size(); ++i) {
    const auto& o = static_cast<const optim::AdamWOptions&>(opt.param_groups()[i].options());
    INFO("group " << groups[i].name);
    CHECK(o.lr() == Approx(lrs[i]));
    CHECK(o.weight_decay() == wds[i]);
  }
  CHECK(optim::matches_wildcard("fc.weight", "fc.*"));
  CHECK(optim::matches_wildcard("blocks.3.attn", "blocks.?.a*"));
  CHECK_FALSE(optim::matches_wildcard("xfc.weight", "fc.*"));
  CHECK_THROWS_AS(optim::layer_ids({"a"}, {{{"(unclosed"}}}), std::invalid_argument);
}

TEST_CASE("lr_groups gives groups of parameters chosen by name their own LRs, as the LR notes' param groups",
          "[optim][layer_decay][lr_groups]") {
  torch::OrderedDict<std::string, at::Tensor> params;
  for (const std::string name : {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "norm.weight",
                                 "fc.weight", "fc.bias"}) {
    params.insert(name, torch::zeros(name.find("weight") != std::string::npos && name != "norm.weight"
                                         ? std::vector<int64_t>{2, 2}
                                         : std::vector<int64_t>{2})
                            .requires_grad_());
  }
  params.insert("frozen.weight", torch::zeros({2, 2}));
  // The notes: conv1 0.01, conv2 0.001, fc 0.0001; "conv*" after "conv1" takes only what conv1 left.
  const std::vector<optim::LrRule> rules{{"conv1", {"conv1.*"}, 0.01}, {"convs", {"conv*"}, 0.001}, {"fc", {"fc.*"}, 1e-4}};
  const auto groups = optim::lr_groups(params, rules, optim::LrGroupsOptions().weight_decay(0.1));
  REQUIRE(groups.size() == 4);
  const std::vector<std::string> names{"conv1", "convs", "fc", "default"};
  const std::vector<std::vector<std::string>> members{
      {"conv1.weight", "conv1.bias"}, {"conv2.weight", "conv2.bias"}, {"fc.weight", "fc.bias"}, {"norm.weight"}};
  for (size_t i = 0; i < groups.size(); ++i) {
    INFO(groups[i].name);
    CHECK(groups[i].name == names[i]);
    CHECK(groups[i].param_names == members[i]);
    CHECK(groups[i].weight_decay == 0.1);
  }
  CHECK_FALSE(groups[3].lr.has_value());  // the unmatched parameters keep the optimizer's LR
  optim::Sgd sgd(optim::to_param_groups(groups, optim::SgdOptions(0.5).momentum(0.9)), optim::SgdOptions(0.5));
  const std::vector<double> lrs{0.01, 0.001, 1e-4, 0.5};
  for (size_t i = 0; i < lrs.size(); ++i) {
    const auto& o = static_cast<const optim::SgdOptions&>(sgd.param_groups()[i].options());
    CHECK(o.lr() == lrs[i]);  // exactly the rule's LR, not a product
    CHECK(o.momentum() == 0.9);
    CHECK(o.weight_decay() == 0.1);
  }

  SECTION("exclude_1d splits each group into a decayed half and a no-decay half") {
    const auto split = optim::lr_groups(params, rules, optim::LrGroupsOptions().weight_decay(0.1).exclude_1d(true));
    std::vector<std::string> split_names;
    for (const auto& g : split) {
      split_names.push_back(g.name);
      CHECK(g.weight_decay == (g.name.find("_no_decay") != std::string::npos ? 0.0 : 0.1));
      for (const auto& p : g.params) {
        CHECK((p.dim() <= 1) == (g.weight_decay == 0.0));
      }
    }
    CHECK(split_names == std::vector<std::string>{"conv1", "conv1_no_decay", "convs", "convs_no_decay", "fc",
                                                  "fc_no_decay", "default_no_decay"});
    CHECK(split[1].lr == 0.01);
  }
  SECTION("a rule that matches nothing, and bad rules, are errors naming the rule") {
    CHECK_THROWS_MATCHES(optim::lr_groups(params, {{"head", {"head.*", "classifier.*"}, 0.1}}), std::invalid_argument,
                         WhatContains("rule \"head\" (head.*, classifier.*) matches no parameter") &&
                             WhatContains("named like conv1.weight, conv1.bias"));
    CHECK_THROWS_MATCHES(optim::lr_groups(params, {{"fc", {"fc.*"}, 0.0}}), std::invalid_argument,
                         WhatContains("rule \"fc\": invalid lr 0"));
    CHECK_THROWS_MATCHES(optim::lr_groups(params, {{"fc", {}, 0.1}}), std::invalid_argument,
                         WhatContains("rule \"fc\" has no pattern"));
    CHECK_THROWS_MATCHES(optim::lr_groups(params, {{"fc", {"fc.*"}, 0.1}, {"fc", {"conv1.*"}, 0.1}}),
                         std::invalid_argument, WhatContains("two rules are called \"fc\""));
  }
}

