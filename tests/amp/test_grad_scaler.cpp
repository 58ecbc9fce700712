// trainkit::amp::GradScaler against Python PyTorch's torch.amp.GradScaler("cpu") (tests/golden/amp.toml):
// the scale, growth tracker and skipped steps of every iteration exactly, the parameters at the end to
// float32 rounding. Then the rules one by one: an inf/NaN gradient leaves parameters and SGD momentum
// untouched and halves the scale; growth after growth_interval clean steps; misuse is a std::logic_error;
// clipping after unscale_() equals clipping the unscaled training's gradients; a disabled scaler is
// transparent; save → load continues the same trace; bad options are named.
#include <cmath>
#include <limits>
#include <sstream>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/amp.h"
#include "trainkit/compat.h"
#include "trainkit/optim/adam.h"
#include "trainkit/optim/sgd.h"

using trainkit::amp::GradScaler;
using trainkit::amp::GradScalerOptions;
using trainkit::amp::OptState;

using trainkit::test::WhatContains;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> doubles(const toml::node_view<const toml::node>& node) {
  std::vector<double> out;
  for (const auto& v : *node.as_array()) {
    out.push_back(v.value<double>().value());
  }
  return out;
}

template <class T>
std::vector<T> values(const toml::node_view<const toml::node>& node) {
  std::vector<T> out;
  for (const auto& v : *node.as_array()) {
    out.push_back(v.value<T>().value());
  }
  return out;
}

at::Tensor float_tensor(const std::vector<double>& v, at::IntArrayRef shape) {
  return torch::tensor(v, torch::kFloat64).to(torch::kFloat32).reshape(shape);
}

/// The golden setup: a float32 Linear(3, 2) with fixed weights, a fixed batch, loss = mean((xWᵀ + b − y)²).
struct Model {
  torch::nn::Linear lin{3, 2};
  at::Tensor x;
  at::Tensor y;

  explicit Model(const toml::table& golden) {
    const auto setup = golden["setup"];
    torch::NoGradGuard no_grad;
    lin->weight.copy_(float_tensor(doubles(setup["weight0"]), {2, 3}));
    lin->bias.copy_(float_tensor(doubles(setup["bias0"]), {2}));
    x = float_tensor(doubles(setup["x"]), {4, 3});
    y = float_tensor(doubles(setup["y"]), {4, 2});
  }
  at::Tensor loss() { return (lin->forward(x) - y).pow(2).mean(); }
  std::vector<at::Tensor> snapshot() const { return {lin->weight.detach().clone(), lin->bias.detach().clone()}; }
};

torch::optim::SGDOptions sgd_options(const toml::table& golden) {
  return torch::optim::SGDOptions(golden["setup"]["lr"].value<double>().value())
      .momentum(golden["setup"]["momentum"].value<double>().value());
}

/// Overwrites one element of `param`'s (scaled) gradient, as the golden generator does after backward.
void inject(const at::Tensor& param, const std::vector<int64_t>& index, double value) {
  std::vector<at::indexing::TensorIndex> idx(index.begin(), index.end());
  at::Tensor grad = param.grad();
  grad.index_put_(idx, value);
}

double pattern_value(const std::string& kind) {
  if (kind == "inf") {
    return kInf;
  }
  if (kind == "-inf") {
    return -kInf;
  }
  REQUIRE(kind == "nan");
  return std::numeric_limits<double>::quiet_NaN();
}

/// One iteration of the documented loop on one optimizer; `bad` (if any) goes into weight[0][1]'s gradient.
bool iterate(GradScaler& scaler, Model& m, torch::optim::Optimizer& opt, std::optional<double> bad = std::nullopt) {
  opt.zero_grad();
  scaler.scale(m.loss()).backward();
  if (bad) {
    inject(m.lin->weight, {0, 1}, *bad);
  }
  const bool stepped = scaler.step(opt);
  scaler.update();
  return stepped;
}

at::Tensor momentum_buffer(torch::optim::Optimizer& opt, const at::Tensor& p) {
  auto& state = static_cast<torch::optim::SGDParamState&>(*opt.state().at(trainkit::compat::param_state_key(p)));
  return state.momentum_buffer();
}

/// One clean step, then one with `bad` in a gradient: checks that nothing moved and the scale halved.
void check_skipped_step(const toml::table& golden, double bad) {
  Model m(golden);
  torch::optim::SGD opt(m.lin->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  GradScaler scaler(torch::kCPU, GradScalerOptions().init_scale(1024.0));
  REQUIRE(iterate(scaler, m, opt));  // a clean step creates the momentum buffers
  REQUIRE(scaler.get_scale() == 1024.0);
  REQUIRE(scaler.get_growth_tracker() == 1);

  const auto params = m.snapshot();
  const auto momentum =
      std::vector<at::Tensor>{momentum_buffer(opt, m.lin->weight).clone(), momentum_buffer(opt, m.lin->bias).clone()};
  opt.zero_grad();
  scaler.scale(m.loss()).backward();
  inject(m.lin->weight, {0, 1}, bad);
  CHECK_FALSE(scaler.step(opt));
  CHECK(scaler.stage(opt) == OptState::STEPPED);
  scaler.update();
  CHECK(scaler.stage(opt) == OptState::READY);

  const auto after = m.snapshot();
  CHECK(torch::equal(after[0], params[0]));
  CHECK(torch::equal(after[1], params[1]));
  CHECK(torch::equal(momentum_buffer(opt, m.lin->weight), momentum[0]));
  CHECK(torch::equal(momentum_buffer(opt, m.lin->bias), momentum[1]));
  CHECK(scaler.get_scale() == 512.0);
  CHECK(scaler.get_growth_tracker() == 0);

  // The next clean iteration steps again, at the halved scale.
  CHECK(iterate(scaler, m, opt));
  CHECK_FALSE(torch::equal(m.lin->weight, params[0]));
  CHECK(scaler.get_scale() == 512.0);
  CHECK(scaler.get_growth_tracker() == 1);
}

/// Eight clean steps with growth_interval 4: the scale grows twice by `growth`.
void check_growth(const toml::table& golden, double growth) {
  Model m(golden);
  torch::optim::SGD opt(m.lin->parameters(), torch::optim::SGDOptions(0.01));
  GradScaler scaler(torch::kCPU, GradScalerOptions().init_scale(8.0).growth_interval(4).growth_factor(growth));
  CHECK(scaler.get_scale() == 8.0);  // before the first scale(): init_scale
  for (int64_t round = 0; round < 2; ++round) {
    const double start = 8.0 * std::pow(growth, static_cast<double>(round));
    for (int64_t i = 1; i <= 3; ++i) {
      REQUIRE(iterate(scaler, m, opt));
      CHECK(scaler.get_scale() == start);
      CHECK(scaler.get_growth_tracker() == i);
    }
    REQUIRE(iterate(scaler, m, opt));
    CHECK(scaler.get_scale() == start * growth);
    CHECK(scaler.get_growth_tracker() == 0);
  }
}

}  // namespace

TEST_CASE("GradScaler reproduces PyTorch's scale, growth tracker and skipped steps", "[amp][scaler][golden]") {
  // On LibTorch's SGD (skip decided on the host), and on trainkit's Sgd through ATen's _fused_sgd_ (the
  // scaler hands it the scale and found_inf; the skip happens on the device, seen here as parameters that
  // did not move).
  const auto& golden = trainkit::test::golden("amp.toml");
  for (const bool aten_fused : {false, true}) {
    for (const auto& node : *golden["case"].as_array()) {
      const auto& c = *node.as_table();
      const std::string name = c["name"].value<std::string>().value();
      DYNAMIC_SECTION(name << (aten_fused ? ", trainkit Sgd aten_fused" : ", torch::optim::SGD")) {
        Model m(golden);
        const auto make = [&](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
          if (aten_fused) {
            return std::make_unique<trainkit::optim::Sgd>(
                std::move(params), trainkit::optim::SgdOptions(golden["setup"]["lr"].value<double>().value())
                                       .momentum(golden["setup"]["momentum"].value<double>().value())
                                       .aten_fused(true));
          }
          return std::make_unique<torch::optim::SGD>(std::move(params), sgd_options(golden));
        };
        std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
        if (c["split_optimizers"].value<bool>().value()) {
          opts.push_back(make({m.lin->weight}));
          opts.push_back(make({m.lin->bias}));
        } else {
          opts.push_back(make(m.lin->parameters()));
        }
        GradScaler scaler(torch::kCPU, GradScalerOptions()
                                           .init_scale(c["init_scale"].value<double>().value())
                                           .growth_factor(c["growth_factor"].value<double>().value())
                                           .backoff_factor(c["backoff_factor"].value<double>().value())
                                           .growth_interval(c["growth_interval"].value<int64_t>().value()));
        const at::Tensor& injected =
            c["inject_param"].value<std::string>().value() == "weight" ? m.lin->weight : m.lin->bias;
        const auto inject_index = values<int64_t>(c["inject_index"]);
        const auto new_scale_at = values<int64_t>(c["new_scale_at"]);
        const auto new_scale_value = doubles(c["new_scale_value"]);
        const auto pattern = values<std::string>(c["pattern"]);
        const auto scale = doubles(c["scale"]);
        const auto tracker = values<int64_t>(c["growth_tracker"]);
        const auto skipped_weight = values<bool>(c["skipped_weight"]);
        const auto skipped_bias = values<bool>(c["skipped_bias"]);
        REQUIRE(scale.size() == pattern.size());

        for (size_t i = 0; i < pattern.size(); ++i) {
          INFO("iteration " << i << " (" << pattern[i] << ")");
          for (auto& opt : opts) {
            opt->zero_grad();
          }
          scaler.scale(m.loss()).backward();
          if (pattern[i] != "ok") {
            inject(injected, inject_index, pattern_value(pattern[i]));
          }
          const auto before = m.snapshot();
          std::vector<bool> stepped;
          for (auto& opt : opts) {
            stepped.push_back(scaler.step(*opt));
          }
          std::optional<double> new_scale;
          for (size_t k = 0; k < new_scale_at.size(); ++k) {
            if (new_scale_at[k] == static_cast<int64_t>(i)) {
              new_scale = new_scale_value[k];
            }
          }
          scaler.update(new_scale);

          const auto after = m.snapshot();
          CHECK(torch::equal(before[0], after[0]) == skipped_weight[i]);
          CHECK(torch::equal(before[1], after[1]) == skipped_bias[i]);
          if (!aten_fused) {
            CHECK(stepped.front() == !skipped_weight[i]);
            CHECK(stepped.back() == !skipped_bias[i]);
          }
          CHECK(scaler.get_scale() == scale[i]);
          CHECK(scaler.get_growth_tracker() == tracker[i]);
        }
        const auto final_weight = float_tensor(doubles(c["final_weight"]), {2, 3});
        const auto final_bias = float_tensor(doubles(c["final_bias"]), {2});
        CHECK(torch::allclose(m.lin->weight, final_weight, 1e-5, 1e-6));
        CHECK(torch::allclose(m.lin->bias, final_bias, 1e-5, 1e-6));
      }
    }
  }
}

TEST_CASE("an inf or NaN gradient skips the step: parameters and momentum unchanged, scale halves", "[amp][scaler]") {
  const auto& golden = trainkit::test::golden("amp.toml");
  for (const double bad : {kInf, -kInf, std::numeric_limits<double>::quiet_NaN()}) {
    DYNAMIC_SECTION("injected " << bad) { check_skipped_step(golden, bad); }
  }
}

TEST_CASE("after growth_interval clean steps the scale grows by growth_factor", "[amp][scaler]") {
  const auto& golden = trainkit::test::golden("amp.toml");
  for (const double growth : {2.0, 3.0}) {
    DYNAMIC_SECTION("growth_factor " << growth) { check_growth(golden, growth); }
  }
}
TEST_CASE("GradScaler misuse is a std::logic_error", "[amp][scaler]") {
  const auto& golden = trainkit::test::golden("amp.toml");
  Model m(golden);
  torch::optim::SGD opt(m.lin->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  CHECK(scaler.get_scale() == 65536.0);

  SECTION("unscale_, step or update before any scale()") {
    m.loss().backward();
    CHECK_THROWS_MATCHES(scaler.unscale_(opt), std::logic_error, WhatContains("scale("));
    CHECK_THROWS_AS(scaler.step(opt), std::logic_error);
    CHECK_THROWS_AS(scaler.update(), std::logic_error);
  }
  scaler.scale(m.loss()).backward();

  SECTION("unscale_ twice in one iteration") {
    scaler.unscale_(opt);
    CHECK(scaler.stage(opt) == OptState::UNSCALED);
    CHECK_THROWS_MATCHES(scaler.unscale_(opt), std::logic_error,
                         WhatContains("unscale_() has already been called on this optimizer since the last update()"));
    // step() after an explicit unscale_ does not unscale again, and the next iteration starts afresh.
    CHECK(scaler.step(opt));
    scaler.update();
    scaler.scale(m.loss()).backward();
    CHECK_NOTHROW(scaler.unscale_(opt));
  }
  SECTION("unscale_ after step") {
    scaler.step(opt);
    CHECK_THROWS_MATCHES(scaler.unscale_(opt), std::logic_error, WhatContains("after step()"));
  }
  SECTION("step twice in one iteration") {
    scaler.step(opt);
    CHECK_THROWS_MATCHES(scaler.step(opt), std::logic_error, WhatContains("already been called"));
  }
  SECTION("update before any step") {
    CHECK_THROWS_MATCHES(scaler.update(), std::logic_error, WhatContains("no inf checks"));
    CHECK_NOTHROW(scaler.update(1024.0));  // an explicit new scale needs no inf checks
    CHECK(scaler.get_scale() == 1024.0);
  }
  SECTION("step on an optimizer none of whose parameters has a gradient") {
    auto p = torch::zeros({2}, torch::requires_grad());
    torch::optim::SGD other(std::vector<at::Tensor>{p}, torch::optim::SGDOptions(0.1));
    CHECK_THROWS_MATCHES(scaler.step(other), std::logic_error, WhatContains("no inf checks"));
  }
}

TEST_CASE("clipping after unscale_ clips the true gradients", "[amp][scaler]") {
  const auto& golden = trainkit::test::golden("amp.toml");
  Model scaled(golden);
  Model plain(golden);
  torch::optim::SGD opt_scaled(scaled.lin->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD opt_plain(plain.lin->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  GradScaler scaler(torch::kCPU, GradScalerOptions().init_scale(1000.0));  // not a power of two: rounding shows
  constexpr double kMaxNorm = 0.05;
  for (int i = 0; i < 6; ++i) {
    INFO("iteration " << i);
    opt_scaled.zero_grad();
    scaler.scale(scaled.loss()).backward();
    scaler.unscale_(opt_scaled);
    const double norm_scaled = torch::nn::utils::clip_grad_norm_(scaled.lin->parameters(), kMaxNorm);
    CHECK(scaler.step(opt_scaled));
    scaler.update();

    opt_plain.zero_grad();
    plain.loss().backward();
    const double norm_plain = torch::nn::utils::clip_grad_norm_(plain.lin->parameters(), kMaxNorm);
    opt_plain.step();

    CHECK(norm_plain > kMaxNorm);  // clipping is active
    CHECK(norm_scaled == Approx(norm_plain).epsilon(1e-5));
    CHECK(torch::allclose(scaled.lin->weight.grad(), plain.lin->weight.grad(), 1e-5, 1e-7));
    CHECK(torch::allclose(scaled.lin->weight, plain.lin->weight, 1e-5, 1e-7));
    CHECK(torch::allclose(scaled.lin->bias, plain.lin->bias, 1e-5, 1e-7));
  }
}

TEST_CASE("a disabled GradScaler is transparent", "[amp][scaler]") {
  const auto& golden = trainkit::test::golden("amp.toml");
  Model m(golden);
  torch::optim::SGD opt(m.lin->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler(torch::kCPU, GradScalerOptions().enabled(false));
  CHECK_FALSE(scaler.is_enabled());
  const auto loss = m.loss();
  const auto scaled = scaler.scale(loss);
  CHECK(scaled.is_same(loss));
  scaled.backward();
  const auto grad = m.lin->weight.grad().clone();
  scaler.unscale_(opt);  // no-op
  CHECK(torch::equal(m.lin->weight.grad(), grad));
  const auto before = m.snapshot();
  CHECK(scaler.step(opt));
  CHECK_FALSE(torch::equal(m.lin->weight, before[0]));
  scaler.update();
  CHECK(scaler.get_scale() == 1.0);
  CHECK(scaler.get_growth_tracker() == 0);
  // Even a non-finite gradient is stepped: a disabled scaler only forwards to opt.step().
  opt.zero_grad();
  scaler.scale(m.loss()).backward();
  inject(m.lin->weight, {0, 1}, kInf);
  CHECK(scaler.step(opt));
  CHECK(std::isinf(m.lin->weight[0][1].item<double>()));
}

TEST_CASE("save → load into a fresh scaler continues the same trace", "[amp][scaler][resume]") {
  const auto& golden = trainkit::test::golden("amp.toml");
  Model m1(golden);
  torch::optim::SGD opt1(m1.lin->parameters(), torch::optim::SGDOptions(0.05));
  GradScaler scaler1(torch::kCPU,
                     GradScalerOptions().init_scale(256.0).growth_interval(3).growth_factor(4.0).backoff_factor(0.25));
  for (const bool bad : {false, false, false, true, false, false}) {
    iterate(scaler1, m1, opt1, bad ? std::optional<double>(kInf) : std::nullopt);
  }
  REQUIRE(scaler1.get_scale() == 256.0);  // 256 → 1024 → 256
  REQUIRE(scaler1.get_growth_tracker() == 2);

  torch::serialize::OutputArchive out;
  scaler1.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);

  GradScaler scaler2(torch::kCPU, GradScalerOptions().init_scale(1.0).growth_interval(100).growth_factor(1.5));
  Model m2(golden);
  SECTION("into a scaler that has not scaled yet") { REQUIRE_NOTHROW(scaler2.load(in)); }
  SECTION("into a scaler that has already scaled") {
    torch::optim::SGD warmup(m2.lin->parameters(), torch::optim::SGDOptions(0.0));
    iterate(scaler2, m2, warmup);
    REQUIRE(scaler2.get_scale() != scaler1.get_scale());  // the load below must replace it
    scaler2.load(in);
  }
  CHECK(scaler2.get_scale() == scaler1.get_scale());
  CHECK(scaler2.get_growth_tracker() == scaler1.get_growth_tracker());
  CHECK(scaler2.get_growth_factor() == 4.0);
  CHECK(scaler2.get_backoff_factor() == 0.25);
  CHECK(scaler2.get_growth_interval() == 3);

  {
    torch::NoGradGuard no_grad;
    m2.lin->weight.copy_(m1.lin->weight);
    m2.lin->bias.copy_(m1.lin->bias);
  }
  torch::optim::SGD opt2(m2.lin->parameters(), torch::optim::SGDOptions(0.05));
  int i = 0;
  for (const bool bad : {false, true, false, false, false, false, false, true, false}) {
    INFO("iteration " << i++ << " after the load");
    const auto inf = bad ? std::optional<double>(kInf) : std::nullopt;
    CHECK(iterate(scaler1, m1, opt1, inf) == iterate(scaler2, m2, opt2, inf));
    CHECK(scaler2.get_scale() == scaler1.get_scale());
    CHECK(scaler2.get_growth_tracker() == scaler1.get_growth_tracker());
    CHECK(torch::equal(m1.lin->weight, m2.lin->weight));
  }
}

TEST_CASE("GradScaler state saved by a disabled scaler cannot be loaded into an enabled one", "[amp][scaler][resume]") {
  GradScaler disabled(torch::kCPU, GradScalerOptions().enabled(false));
  torch::serialize::OutputArchive out;
  disabled.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  GradScaler enabled;
  CHECK_THROWS_MATCHES(enabled.load(in), std::runtime_error, WhatContains("disabled"));
  GradScaler other_disabled(torch::kCPU, GradScalerOptions().enabled(false));
  CHECK_NOTHROW(other_disabled.load(in));
}

TEST_CASE("GradScaler options are validated, naming the option and value", "[amp][scaler]") {
  using trainkit::amp::GradScalerOptions;
  const auto expect_invalid = [](const GradScalerOptions& options, const std::string& name, const std::string& value) {
    INFO(name << " = " << value);
    CHECK_THROWS_MATCHES(GradScaler(torch::kCPU, options), std::invalid_argument,
                         WhatContains("GradScaler: " + name + ": expected") && WhatContains("got " + value));
  };
  expect_invalid(GradScalerOptions().growth_factor(1.0), "growth_factor", "1");
  expect_invalid(GradScalerOptions().growth_factor(0.5), "growth_factor", "0.5");
  expect_invalid(GradScalerOptions().backoff_factor(1.0), "backoff_factor", "1");
  expect_invalid(GradScalerOptions().backoff_factor(0.0), "backoff_factor", "0");
  expect_invalid(GradScalerOptions().backoff_factor(-0.5), "backoff_factor", "-0.5");
  expect_invalid(GradScalerOptions().growth_interval(0), "growth_interval", "0");
  expect_invalid(GradScalerOptions().init_scale(0.0), "init_scale", "0");
  expect_invalid(GradScalerOptions().init_scale(-2.0), "init_scale", "-2");
  expect_invalid(GradScalerOptions().init_scale(kInf), "init_scale", "inf");
  // Validated even when disabled: an out-of-range option is a configuration error either way.
  expect_invalid(GradScalerOptions().enabled(false).growth_factor(1.0), "growth_factor", "1");

  GradScalerOptions defaults;
  CHECK(defaults.init_scale() == 65536.0);
  CHECK(defaults.growth_factor() == 2.0);
  CHECK(defaults.backoff_factor() == 0.5);
  CHECK(defaults.growth_interval() == 2000);
  CHECK(defaults.enabled());

  GradScaler scaler;
  CHECK_THROWS_MATCHES(scaler.set_growth_factor(1.0), std::invalid_argument, WhatContains("growth_factor"));
  CHECK_THROWS_MATCHES(scaler.set_backoff_factor(1.5), std::invalid_argument, WhatContains("backoff_factor"));
  CHECK_THROWS_MATCHES(scaler.set_growth_interval(0), std::invalid_argument, WhatContains("growth_interval"));
  scaler.set_growth_factor(3.0);
  scaler.set_backoff_factor(0.125);
  scaler.set_growth_interval(7);
  CHECK(scaler.get_growth_factor() == 3.0);
  CHECK(scaler.get_backoff_factor() == 0.125);
  CHECK(scaler.get_growth_interval() == 7);
}

TEST_CASE("GradScaler unscales gradients of several dtypes and rejects sparse and float16 ones", "[amp][scaler]") {
  GradScaler scaler(torch::kCPU, GradScalerOptions().init_scale(4.0));

  SECTION("float32 and float64 parameters in one optimizer") {
    auto p32 = torch::ones({3}, torch::requires_grad());
    auto p64 = torch::ones({2}, torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true));
    torch::optim::SGD opt(std::vector<at::Tensor>{p32, p64}, torch::optim::SGDOptions(1.0));
    const auto loss = p32.sum() * 3.0 + p64.sum() * 5.0;
    const auto scaled = scaler.scale({loss, loss});
    CHECK(scaled.size() == 2);
    CHECK(scaled[1].item<double>() == Approx(4.0 * 19.0));
    scaled[0].backward();
    CHECK(p32.grad()[0].item<double>() == 12.0);
    scaler.unscale_(opt);
    CHECK(torch::equal(p32.grad(), torch::full({3}, 3.0)));
    CHECK(torch::equal(p64.grad(), torch::full({2}, 5.0, torch::kFloat64)));
    SECTION("clean") { CHECK(scaler.step(opt)); }
    SECTION("a NaN in the float64 gradient skips the whole step") {
      p64.grad()[1] = std::numeric_limits<double>::quiet_NaN();
      // The check ran in unscale_(); a NaN written afterwards is not seen, exactly as in Python.
      CHECK(scaler.step(opt));
      scaler.update();
      opt.zero_grad();
      scaler.scale(p32.sum() + p64.sum()).backward();
      p64.grad()[1] = std::numeric_limits<double>::quiet_NaN();
      const auto before = p32.detach().clone();
      CHECK_FALSE(scaler.step(opt));
      CHECK(torch::equal(p32, before));
    }
  }
  SECTION("sparse gradients are unsupported") {
    torch::nn::Embedding emb(torch::nn::EmbeddingOptions(10, 3).sparse(true));
    torch::optim::SGD opt(emb->parameters(), torch::optim::SGDOptions(0.1));
    scaler.scale(emb->forward(torch::tensor({1, 2}, torch::kLong)).sum()).backward();
    REQUIRE(emb->weight.grad().is_sparse());
    CHECK_THROWS_MATCHES(scaler.unscale_(opt), std::invalid_argument, WhatContains("sparse gradients are unsupported"));
  }
  SECTION("float16 gradients are rejected, as in Python") {
    auto p = torch::ones({2}, torch::TensorOptions().dtype(torch::kHalf).requires_grad(true));
    torch::optim::SGD opt(std::vector<at::Tensor>{p}, torch::optim::SGDOptions(0.1));
    scaler.scale(p.sum()).backward();
    CHECK_THROWS_MATCHES(scaler.unscale_(opt), std::invalid_argument, WhatContains("float16"));
  }
}

TEST_CASE("GradScaler on CUDA", "[amp][scaler][cuda]") {
  if (!torch::cuda::is_available()) {
    // As in Python, an enabled CUDA scaler without CUDA disables itself (with a warning).
    GradScaler scaler(torch::kCUDA);
    CHECK_FALSE(scaler.is_enabled());
    TRAINKIT_SKIP("no CUDA device: the CUDA GradScaler sequence needs a GPU");
  }
  torch::nn::Linear lin(3, 2);
  lin->to(torch::kCUDA);
  torch::optim::SGD opt(lin->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  GradScaler scaler(torch::kCUDA, GradScalerOptions().init_scale(1024.0).growth_interval(2));
  const auto x = torch::randn({4, 3}, torch::kCUDA);
  const auto run = [&](bool bad) {
    opt.zero_grad();
    at::Tensor loss;
    {
      trainkit::amp::Autocast autocast(torch::kCUDA, torch::kHalf);
      loss = lin->forward(x).pow(2).mean();
      CHECK(lin->forward(x).scalar_type() == torch::kHalf);
    }
    scaler.scale(loss).backward();
    CHECK(lin->weight.grad().scalar_type() == torch::kFloat32);
    if (bad) {
      lin->weight.grad()[0][0] = kInf;
    }
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  };
  CHECK(run(false));
  CHECK(run(false));
  CHECK(scaler.get_scale() == 2048.0);
  const auto before = lin->weight.detach().clone();
  CHECK_FALSE(run(true));
  CHECK(torch::equal(lin->weight, before));
  CHECK(scaler.get_scale() == 1024.0);
  CHECK(scaler.get_growth_tracker() == 0);
}

TEST_CASE("GradScaler hands unscaling to a fused trainkit optimizer (ScaledStep)", "[amp][scaler][optim]") {
  // Same steps as unscale_() followed by a plain step; an overflow skips the step and backs the scale off,
  // and the gradients stay as they were (scaled) on the fused path.
  const auto run = [](bool explicit_unscale, bool overflow_at_2) {
    torch::manual_seed(0);
    auto w = torch::randn({64, 8}).requires_grad_();
    auto b = torch::randn({8}).requires_grad_();
    trainkit::optim::Adam opt({w, b}, trainkit::optim::AdamOptions(1e-2));
    trainkit::amp::GradScaler scaler(c10::kCPU, trainkit::amp::GradScalerOptions().init_scale(256.0));
    std::vector<bool> stepped;
    for (int step = 0; step < 4; ++step) {
      opt.zero_grad();
      auto loss = (w.sin().sum(1) + b.sum()).pow(2).mean();
      scaler.scale(loss).backward();
      if (overflow_at_2 && step == 2) {
        torch::NoGradGuard no_grad;
        w.mutable_grad()[3][1] = std::numeric_limits<float>::infinity();
      }
      if (explicit_unscale) {
        scaler.unscale_(opt);
      }
      stepped.push_back(scaler.step(opt));
      scaler.update();
    }
    return std::make_tuple(w.detach().clone(), b.detach().clone(), stepped, scaler.get_scale());
  };
  const auto [w1, b1, s1, scale1] = run(false, false);
  const auto [w2, b2, s2, scale2] = run(true, false);
  CHECK(torch::allclose(w1, w2, 1e-6, 1e-7));
  CHECK(torch::allclose(b1, b2, 1e-6, 1e-7));
  CHECK(scale1 == scale2);
  const auto [w3, b3, s3, scale3] = run(false, true);
  const auto [w4, b4, s4, scale4] = run(true, true);
  CHECK(s3 == std::vector<bool>{true, true, false, true});
  CHECK(s3 == s4);
  CHECK(scale3 == 128.0);
  CHECK(scale3 == scale4);
  CHECK(torch::allclose(w3, w4, 1e-6, 1e-7));
}

TEST_CASE("the fused overflow check finds an inf or NaN wherever it sits", "[amp][scaler][optim]") {
  // The check reads each thread's range as four interleaved quarters plus a tail: place the bad value in
  // every quarter, in the tail, and in a tensor shorter than one vector block.
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t where : {0, 239, 240, 500, 719, 720, 959, 960, 999, 1000, 1006}) {
    for (const float bad : {inf, -inf, nan}) {
      CAPTURE(where, bad);
      auto big = torch::randn({1000}).requires_grad_();
      auto small = torch::randn({7}).requires_grad_();
      trainkit::optim::Adam opt({big, small}, trainkit::optim::AdamOptions(1e-2));
      trainkit::amp::GradScaler scaler(c10::kCPU, trainkit::amp::GradScalerOptions().init_scale(4.0));
      scaler.scale(big.sum() + small.sum()).backward();
      {
        torch::NoGradGuard no_grad;
        auto& grad = where < 1000 ? big.mutable_grad() : small.mutable_grad();
        grad[where < 1000 ? where : where - 1000] = bad;
      }
      const auto before = big.detach().clone();
      CHECK_FALSE(scaler.step(opt));
      CHECK(torch::equal(big.detach(), before));
      scaler.update();
      CHECK(scaler.get_scale() == 2.0);
    }
  }
}
