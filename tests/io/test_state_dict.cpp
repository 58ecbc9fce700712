// Loading by name, shared by both formats: Python's state_dict order, one report of every missing,
// unexpected and mismatched key (strict throws it and leaves the module alone), and the renaming hooks.
#include <torch/torch.h>

#include "io/io_support.h"
#include "support.h"
#include "trainkit/io/safetensors.h"
#include "trainkit/io/torch_save.h"
#include "trainkit/nn/models.h"

using namespace trainkit::io;
using trainkit::test::TempDir;
using trainkit::test::WhatContains;

namespace {

torch::nn::Sequential small_cnn(uint64_t seed) {
  torch::manual_seed(seed);
  return trainkit::nn::make_cnn(trainkit::nn::CnnOptions().image_size(8).channels({3}).hidden(5).num_classes(4));
}

bool same_state(const torch::nn::Module& a, const torch::nn::Module& b) {
  const TensorDict sa = state_dict(a);
  const TensorDict sb = state_dict(b);
  if (sa.keys() != sb.keys()) {
    return false;
  }
  for (const auto& item : sa) {
    if (trainkit::test::hex_of(item.value()) != trainkit::test::hex_of(sb[item.key()])) {
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("state_dict names parameters and buffers in Python's order", "[io][state_dict]") {
  auto net = small_cnn(1);
  CHECK(state_dict(*net).keys() ==
        std::vector<std::string>{"0.weight", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                                 "1.num_batches_tracked", "6.weight", "6.bias", "9.weight", "9.bias"});
  CHECK(state_dict(*net)["0.weight"].is_same(net[0]->as<torch::nn::Conv2d>()->weight));
}

TEST_CASE("load by name: every format loads the same way, strict or not", "[io][state_dict]") {
  TempDir tmp("sd-load");
  const auto source = small_cnn(1);
  const std::string st = tmp.str("cnn.safetensors");
  const std::string pt = tmp.str("cnn.pt");
  save_safetensors(st, *source);
  save_pt(pt, *source);
  for (const std::string& path : {st, pt}) {
    INFO(path);
    auto target = small_cnn(2);
    REQUIRE_FALSE(same_state(*source, *target));
    const LoadReport report = path == st ? load_safetensors(*target, path) : load_pt(*target, path);
    CHECK(report.ok());
    CHECK(report.loaded.size() == 10);
    CHECK(report.source == path);
    CHECK(same_state(*source, *target));
  }
}

TEST_CASE("one report names every missing, unexpected and mismatched key", "[io][state_dict][errors]") {
  TempDir tmp("sd-report");
  const auto source = small_cnn(1);
  TensorDict tensors = state_dict(*source);
  TensorDict edited;
  for (const auto& item : tensors) {
    if (item.key() == "6.bias") {
      continue;  // missing
    }
    if (item.key() == "9.weight") {
      edited.insert(item.key(), item.value().t().contiguous());  // shape [5, 4] instead of [4, 5]
    } else if (item.key() == "1.running_var") {
      edited.insert(item.key(), item.value().to(torch::kFloat64));  // dtype
    } else {
      edited.insert(item.key(), item.value());
    }
  }
  edited.insert("head.extra", torch::zeros({2}));  // unexpected
  const std::string path = tmp.str("edited.safetensors");
  save_safetensors(path, edited);

  auto target = small_cnn(2);
  const auto before = state_dict(*target);
  std::vector<std::string> before_hex;
  for (const auto& item : before) {
    before_hex.push_back(trainkit::test::hex_of(item.value()));
  }
  SECTION("strict throws the whole report and loads nothing") {
    try {
      load_safetensors(*target, path);
      FAIL("strict load accepted a mismatched file");
    } catch (const LoadReportError& e) {
      const std::string what = e.what();
      INFO(what);
      for (const char* fragment : {path.c_str(), "missing: '6.bias'", "unexpected: 'head.extra'",
                                   "mismatched: '9.weight': [5, 4] (Float) in the file, [4, 5] (Float)",
                                   "mismatched: '1.running_var': [3] (Double) in the file, [3] (Float)"}) {
        CHECK(what.find(fragment) != std::string::npos);
      }
      CHECK(e.report().loaded.size() == 7);
    }
    size_t i = 0;
    for (const auto& item : state_dict(*target)) {
      CHECK(trainkit::test::hex_of(item.value()) == before_hex[i++]);
    }
  }
  SECTION("not strict loads what matches and returns the report") {
    const LoadReport report = load_safetensors(*target, path, LoadOptions().strict(false));
    CHECK_FALSE(report.ok());
    CHECK(report.missing == std::vector<std::string>{"6.bias"});
    REQUIRE(report.unexpected.size() == 1);
    CHECK(report.unexpected[0].file_key == "head.extra");
    REQUIRE(report.mismatched.size() == 2);
    CHECK(report.loaded.size() == 7);
    const auto after = state_dict(*target);
    CHECK(trainkit::test::hex_of(after["0.weight"]) == trainkit::test::hex_of(tensors["0.weight"]));
    CHECK(trainkit::test::hex_of(after["6.bias"]) == trainkit::test::hex_of(before["6.bias"]));
  }
}

TEST_CASE("renaming hooks map a checkpoint's names onto the module's", "[io][state_dict][rename]") {
  TempDir tmp("sd-rename");
  const auto source = small_cnn(1);
  TensorDict prefixed;
  for (const auto& item : state_dict(*source)) {
    prefixed.insert("module.features." + item.key(), item.value());
  }
  prefixed.insert("module.optimizer_step", torch::tensor(int64_t{3}));
  const std::string path = tmp.str("prefixed.pt");
  save_pt(path, prefixed);

  SECTION("strip a prefix, drop a key") {
    auto target = small_cnn(2);
    const Rename drop_step = [](const std::string& key) -> std::optional<std::string> {
      if (key == "module.optimizer_step") {
        return std::nullopt;
      }
      return key;
    };
    const LoadReport report =
        load_pt(*target, path, LoadOptions().rename(chain({strip_prefix("module.features."), drop_step})));
    CHECK(report.ok());
    CHECK(report.ignored == std::vector<std::string>{"module.optimizer_step"});
    CHECK(same_state(*source, *target));
  }
  SECTION("regex rename, and the report shows both names") {
    auto target = small_cnn(2);
    const LoadReport report =
        load_pt(*target, path, LoadOptions().strict(false).rename(regex_rename(R"(^module\.features\.(\d+)\.)", "$1.")));
    CHECK(report.loaded.size() == 10);
    REQUIRE(report.unexpected.size() == 1);
    CHECK(report.unexpected[0].key == "module.optimizer_step");
    CHECK(same_state(*source, *target));
  }
  SECTION("add a prefix; two keys renamed onto one are reported") {
    auto outer = std::make_shared<torch::nn::Module>();
    const auto backbone = outer->register_module("backbone", small_cnn(2));
    save_safetensors(tmp.str("plain.safetensors"), *source);
    CHECK(load_safetensors(*outer, tmp.str("plain.safetensors"), LoadOptions().rename(add_prefix("backbone."))).ok());
    CHECK(same_state(*source, *backbone));
    const Rename onto_one = [](const std::string& key) -> std::optional<std::string> {
      return key == "6.bias" ? std::string("backbone.9.bias") : "backbone." + key;
    };
    const LoadReport report =
        load_safetensors(*outer, tmp.str("plain.safetensors"), LoadOptions().strict(false).rename(onto_one));
    REQUIRE(report.unexpected.size() == 1);
    CHECK_THAT(report.to_string(), Catch::Matchers::Contains("already loads into 'backbone.9.bias'"));
    CHECK(report.missing == std::vector<std::string>{"backbone.6.bias"});
  }
  CHECK_THROWS_MATCHES(regex_rename("(", ""), std::invalid_argument, WhatContains("invalid pattern '('"));
}
