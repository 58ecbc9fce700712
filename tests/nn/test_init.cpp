// trainkit::nn::init against torch.nn.init (tests/golden/nn.toml: same seed, same shape, every value), the
// sample statistics against the formulas, and apply() with rules and schemes over a module tree.
#include <cmath>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/nn/init.h"
#include "trainkit/nn/models.h"

namespace init = trainkit::nn::init;

namespace {

double num(const toml::table& t, const std::string& key, double fallback) {
  const auto* node = t.get(key);
  return node == nullptr ? fallback : node->value<double>().value();
}

std::string str(const toml::table& t, const std::string& key, const std::string& fallback) {
  const auto* node = t.get(key);
  return node == nullptr ? fallback : node->value<std::string>().value();
}

init::FanMode fan_mode(const std::string& mode) { return mode == "fan_out" ? init::FanMode::fan_out : init::FanMode::fan_in; }

/// Calls the initializer the golden case names, with its keyword arguments (PyTorch's defaults otherwise).
void run_case(const toml::table& c, at::Tensor t) {
  const std::string name = str(c, "init", "");
  if (name == "uniform_") {
    init::uniform_(t, num(c, "a", 0.0), num(c, "b", 1.0));
  } else if (name == "normal_") {
    init::normal_(t, num(c, "mean", 0.0), num(c, "std", 1.0));
  } else if (name == "trunc_normal_") {
    init::trunc_normal_(t, num(c, "mean", 0.0), num(c, "std", 1.0), num(c, "a", -2.0), num(c, "b", 2.0));
  } else if (name == "constant_") {
    init::constant_(t, num(c, "val", 0.0));
  } else if (name == "zeros_") {
    init::zeros_(t);
  } else if (name == "ones_") {
    init::ones_(t);
  } else if (name == "kaiming_normal_") {
    init::kaiming_normal_(t, num(c, "a", 0.0), fan_mode(str(c, "mode", "fan_in")), str(c, "nonlinearity", "leaky_relu"));
  } else if (name == "kaiming_uniform_") {
    init::kaiming_uniform_(t, num(c, "a", 0.0), fan_mode(str(c, "mode", "fan_in")),
                           str(c, "nonlinearity", "leaky_relu"));
  } else if (name == "xavier_normal_") {
    init::xavier_normal_(t, num(c, "gain", 1.0));
  } else if (name == "xavier_uniform_") {
    init::xavier_uniform_(t, num(c, "gain", 1.0));
  } else if (name == "orthogonal_") {
    init::orthogonal_(t, num(c, "gain", 1.0));
  } else {
    FAIL("unknown initializer in nn.toml: " << name);
  }
}

}  // namespace

TEST_CASE("init: every initializer fills the values torch.nn.init fills for the same seed", "[nn][init][golden]") {
  const auto& g = trainkit::test::golden("nn.toml");
  int cases = 0;
  for (const auto& node : *g["case"].as_array()) {
    const auto& c = *node.as_table();
    std::vector<int64_t> shape;
    for (const auto& d : *c["shape"].as_array()) {
      shape.push_back(d.value<int64_t>().value());
    }
    torch::manual_seed(static_cast<uint64_t>(c["seed"].value<int64_t>().value()));
    at::Tensor t = torch::empty(shape);
    run_case(c, t);
    std::vector<float> want;
    for (const auto& v : *c["values"].as_array()) {
      want.push_back(static_cast<float>(v.value<double>().value()));
    }
    const at::Tensor expected = torch::tensor(want).reshape(shape);
    const std::string name = str(c, "init", "");
    INFO(name << " seed " << c["seed"].value<int64_t>().value() << ", max |diff| "
              << (t - expected).abs().max().item<double>());
    if (name == "orthogonal_") {
      // The same normal draw; Q from LAPACK's QR, which may round differently in its last bits.
      REQUIRE(torch::allclose(t, expected, 0.0, 1e-6));
    } else {
      REQUIRE(torch::equal(t, expected));
    }
    ++cases;
  }
  REQUIRE(cases >= 20);
}

TEST_CASE("init: calculate_gain and fans match torch.nn.init", "[nn][init][golden]") {
  const auto& g = trainkit::test::golden("nn.toml");
  const auto& names = *g["gain"]["nonlinearity"].as_array();
  const auto& params = *g["gain"]["param"].as_array();
  const auto& values = *g["gain"]["value"].as_array();
  for (size_t i = 0; i < names.size(); ++i) {
    const double p = params.get(i)->value<double>().value();
    const double got = init::calculate_gain(names.get(i)->value<std::string>().value(),
                                            p < 0 ? std::nullopt : std::optional<double>(p));
    REQUIRE(got == values.get(i)->value<double>().value());
  }
  REQUIRE_THROWS_AS(init::calculate_gain("softmax"), std::invalid_argument);
  REQUIRE(init::calculate_fan_in_and_fan_out(torch::empty({8, 3, 5, 5})) == std::pair<int64_t, int64_t>{75, 200});
  REQUIRE_THROWS_AS(init::calculate_fan_in_and_fan_out(torch::empty({8})), std::invalid_argument);
}

TEST_CASE("init: sample statistics match the formulas on a large tensor", "[nn][init]") {
  torch::manual_seed(0);
  const int64_t fan_out = 256;
  const int64_t fan_in = 1024;
  at::Tensor w = torch::empty({fan_out, fan_in});
  const auto std_of = [](const at::Tensor& t) { return t.std().item<double>(); };
  const auto near = [](double got, double want, double rel) {
    INFO("got " << got << ", want " << want);
    REQUIRE(std::abs(got - want) <= rel * want);
  };
  init::kaiming_normal_(w, 0.0, init::FanMode::fan_in, "relu");
  near(std_of(w), std::sqrt(2.0 / fan_in), 0.01);
  init::kaiming_normal_(w, 0.2, init::FanMode::fan_out, "leaky_relu");
  near(std_of(w), std::sqrt(2.0 / (1 + 0.04)) / std::sqrt(double(fan_out)), 0.01);
  init::kaiming_uniform_(w, 0.0, init::FanMode::fan_in, "relu");
  const double bound = std::sqrt(6.0 / fan_in);
  REQUIRE(w.abs().max().item<double>() <= bound);
  near(w.abs().max().item<double>(), bound, 0.001);
  near(std_of(w), bound / std::sqrt(3.0), 0.01);
  init::xavier_normal_(w);
  near(std_of(w), std::sqrt(2.0 / (fan_in + fan_out)), 0.01);
  init::xavier_uniform_(w, 2.0);
  near(std_of(w), 2.0 * std::sqrt(2.0 / (fan_in + fan_out)), 0.01);
  init::lecun_normal_(w);
  near(std_of(w), 1.0 / std::sqrt(double(fan_in)), 0.01);
  // N(0, 1) truncated to [-2, 2]: variance 1 - 2·2·φ(2) / (Φ(2) - Φ(-2)).
  init::trunc_normal_(w);
  const double phi2 = std::exp(-2.0) / std::sqrt(2 * M_PI);
  const double mass = std::erf(2.0 / std::sqrt(2.0));
  REQUIRE(w.abs().max().item<double>() <= 2.0);
  near(std_of(w), std::sqrt(1 - 4 * phi2 / mass), 0.01);
  near(w.mean().item<double>() + 1.0, 1.0, 0.01);
  // Orthogonal: rows orthonormal (256 x 1024 is wide), times the gain.
  init::orthogonal_(w, 3.0);
  const at::Tensor gram = torch::mm(w, w.t()) / 9.0;
  REQUIRE(torch::allclose(gram, torch::eye(fan_out), 0.0, 1e-4));
  at::Tensor tall = torch::empty({300, 20});
  init::orthogonal_(tall);
  REQUIRE(torch::allclose(torch::mm(tall.t(), tall), torch::eye(20), 0.0, 1e-5));
}

namespace {

/// A residual block with the names torchvision's BasicBlock uses: conv1, bn1, conv2, bn2.
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).padding(1).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(4));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(4));
  }
  at::Tensor forward(const at::Tensor& x) {
    return torch::relu(x + bn2->forward(conv2->forward(torch::relu(bn1->forward(conv1->forward(x))))));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(Block);

}  // namespace

TEST_CASE("init::apply: first matching rule by module type, parameter name and path", "[nn][init]") {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)), Block(), Block(),
                            torch::nn::Flatten(), torch::nn::Linear(4 * 8 * 8, 10));
  auto rules = init::scheme("kaiming_normal");
  rules.insert(rules.begin(), init::zero_init_residual(R"(\d+\.bn2\.weight)"));
  const auto done = init::apply(*net, rules);
  // 2 (first conv) + 2 x 6 (two blocks: conv1, bn1 w+b, conv2, bn2 w+b) + 2 (linear).
  REQUIRE(done.size() == 16);
  REQUIRE(done.front() == "0.weight");
  const auto params = net->named_parameters();
  REQUIRE(params["1.bn2.weight"].abs().sum().item<double>() == 0.0);
  REQUIRE(params["2.bn2.weight"].abs().sum().item<double>() == 0.0);
  REQUIRE(torch::equal(params["1.bn1.weight"], torch::ones({4})));
  REQUIRE(params["0.bias"].abs().sum().item<double>() == 0.0);
  REQUIRE(params["4.bias"].abs().sum().item<double>() == 0.0);
  // A residual block starts as the identity (after the ReLU): its branch outputs 0.
  auto block = net->ptr(1)->as<BlockImpl>();
  const at::Tensor x = torch::rand({2, 4, 8, 8});
  REQUIRE(torch::equal(block->forward(x), torch::relu(x)));

  SECTION("a rule with a parameter name and no type; parameters no rule matches keep their values") {
    const at::Tensor before = params["4.weight"].clone();
    const auto only = init::apply(*net, {init::Rule{"", "bias", "", [](at::Tensor t) { init::constant_(t, 0.5); }}});
    REQUIRE(only == std::vector<std::string>{"0.bias", "1.bn1.bias", "1.bn2.bias", "2.bn1.bias", "2.bn2.bias", "4.bias"});
    REQUIRE(torch::equal(params["4.weight"], before));
    REQUIRE(torch::equal(params["4.bias"], torch::full({10}, 0.5)));
  }
  SECTION("errors") {
    REQUIRE_THROWS_AS(init::apply(*net, {init::Rule{"", "", "(", [](at::Tensor) {}}}), std::invalid_argument);
    REQUIRE_THROWS_AS(init::apply(*net, {init::Rule{"Linear", "", "", nullptr}}), std::invalid_argument);
    REQUIRE_THROWS_AS(init::scheme("he"), std::invalid_argument);
  }
}

TEST_CASE("init::scheme: every named scheme on the CNN, with the std its formula gives", "[nn][init]") {
  for (const auto& name : init::scheme_names()) {
    torch::manual_seed(0);
    auto cnn = trainkit::nn::make_cnn(trainkit::nn::CnnOptions().channels({32, 64}).hidden(256));
    torch::manual_seed(0);
    auto reference = trainkit::nn::make_cnn(trainkit::nn::CnnOptions().channels({32, 64}).hidden(256));
    init::apply(*cnn, init::scheme(name));
    const at::Tensor w = cnn->named_parameters()["4.weight"];  // the second conv: 64 x 32 x 3 x 3
    const double fan_in = 32 * 9;
    const double fan_out = 64 * 9;
    double want = 0;
    if (name == "default") {
      REQUIRE(torch::equal(w, reference->named_parameters()["4.weight"]));
      want = std::sqrt(2.0 / (1 + 5.0)) * std::sqrt(3.0 / fan_in) / std::sqrt(3.0);  // kaiming_uniform_(a = √5)
    } else if (name == "kaiming_normal" || name == "kaiming_uniform") {
      want = std::sqrt(2.0 / fan_in);
    } else if (name == "xavier_normal" || name == "xavier_uniform") {
      want = std::sqrt(2.0 / (fan_in + fan_out));
    } else if (name == "lecun_normal") {
      want = 1.0 / std::sqrt(fan_in);
    }
    INFO(name << ": std " << w.std().item<double>() << ", want " << want);
    REQUIRE(std::abs(w.std().item<double>() - want) <= 0.03 * want);
  }
}
