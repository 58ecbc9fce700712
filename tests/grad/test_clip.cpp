// clip_grad_norm_ / clip_grad_value_ against torch.nn.utils (tests/golden/grad.toml) for 1, 2, p and
// inf norms, on both the fused path (contiguous CPU float64) and the reference path (non-contiguous).
#include <cmath>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/grad/clip.h"

using trainkit::grad::clip_grad_norm_;
using Catch::Matchers::Contains;

namespace {

std::vector<at::Tensor> golden_params(const toml::table& g, bool contiguous) {
  std::vector<at::Tensor> params;
  const auto& shapes = *g["shapes"].as_array();
  const auto& grads = *g["grads"].as_array();
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::vector<int64_t> shape;
    for (const auto& d : *shapes.get(i)->as_array()) {
      shape.push_back(d.value<int64_t>().value());
    }
    std::vector<double> values;
    for (const auto& v : *grads.get(i)->as_array()) {
      values.push_back(v.value<double>().value());
    }
    at::Tensor p = torch::zeros(shape, torch::kFloat64).requires_grad_();
    at::Tensor grad = torch::tensor(values, torch::kFloat64).reshape(shape);
    if (!contiguous && grad.dim() >= 2) {
      grad = grad.transpose(0, 1).contiguous().transpose(0, 1);  // same values, non-contiguous layout
    }
    p.mutable_grad() = grad;
    params.push_back(p);
  }
  return params;
}

void require_close(double got, double want) {
  INFO("got " << got << " want " << want);
  REQUIRE(std::abs(got - want) <= 1e-12 * std::max(std::abs(want), 1.0));
}

void require_grads(const std::vector<at::Tensor>& params, const toml::array& expected) {
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor flat = params[i].grad().flatten();
    const auto& want = *expected.get(i)->as_array();
    for (size_t k = 0; k < want.size(); ++k) {
      require_close(flat[static_cast<int64_t>(k)].item<double>(), want.get(k)->value<double>().value());
    }
  }
}

}  // namespace

TEST_CASE("clip_grad_norm_ matches torch.nn.utils.clip_grad_norm_", "[grad][clip][golden]") {
  const auto& g = trainkit::test::golden("grad.toml");
  for (const bool contiguous : {true, false}) {
    for (const auto& node : *g["norm_case"].as_array()) {
      const auto& c = *node.as_table();
      const double norm_type = c["norm_type"].value<double>().value();
      const double max_norm = c["max_norm"].value<double>().value();
      DYNAMIC_SECTION((contiguous ? "fused" : "reference") << " path, norm " << norm_type << ", max " << max_norm) {
        auto params = golden_params(g, contiguous);
        REQUIRE(params[1].grad().is_contiguous() == contiguous);
        const at::Tensor total = clip_grad_norm_(params, max_norm, norm_type);
        CHECK(total.dim() == 0);
        CHECK(total.scalar_type() == torch::kFloat64);
        require_close(total.item<double>(), c["total_norm"].value<double>().value());
        require_grads(params, *c["clipped"].as_array());
      }
    }
  }
}

TEST_CASE("clip_grad_value_ matches torch.nn.utils.clip_grad_value_", "[grad][clip][golden]") {
  const auto& g = trainkit::test::golden("grad.toml");
  auto params = golden_params(g, true);
  trainkit::grad::clip_grad_value_(params, g["value_case"]["clip_value"].value<double>().value());
  require_grads(params, *g["value_case"]["clipped"].as_array());
  CHECK_THROWS_WITH(trainkit::grad::clip_grad_value_(params, -1), Contains("clip_value"));
}

TEST_CASE("clip_grad_norm_ on float32, many tensors, no gradient, non-finite", "[grad][clip]") {
  torch::manual_seed(3);
  std::vector<at::Tensor> params;
  for (int i = 0; i < 300; ++i) {
    at::Tensor p = torch::zeros({i % 7 + 1, 33}).requires_grad_();
    p.mutable_grad() = torch::randn({i % 7 + 1, 33});
    params.push_back(p);
  }
  params.push_back(torch::zeros({4}).requires_grad_());  // no gradient: skipped
  std::vector<at::Tensor> copy;
  for (const auto& p : params) {
    at::Tensor q = p.detach().clone().requires_grad_();
    if (p.grad().defined()) {
      q.mutable_grad() = p.grad().clone();
    }
    copy.push_back(q);
  }
  const at::Tensor ours = clip_grad_norm_(params, 1.0);
  const double theirs = torch::nn::utils::clip_grad_norm_(copy, 1.0);
  CHECK(ours.scalar_type() == torch::kFloat32);
  CHECK(ours.item<double>() == Approx(theirs).epsilon(1e-6));
  for (size_t i = 0; i + 1 < params.size(); ++i) {
    REQUIRE(torch::allclose(params[i].grad(), copy[i].grad(), 1e-5, 1e-7));
  }
  CHECK(trainkit::grad::grad_norm(params).item<double>() == Approx(1.0).epsilon(1e-5));

  SECTION("no clipping needed leaves gradients bitwise unchanged") {
    const at::Tensor before = params[5].grad().clone();
    clip_grad_norm_(params, 100.0);
    CHECK(torch::equal(before, params[5].grad()));
  }
  SECTION("non-finite gradient named with error_if_nonfinite") {
    params[42].mutable_grad()[0][3] = std::nan("");
    CHECK_THROWS_WITH(clip_grad_norm_(params, 1.0, 2.0, true), Contains("non-finite") && Contains("parameter 42"));
    auto model = torch::nn::Linear(3, 2);
    model->bias.mutable_grad() = torch::tensor({1.0f, INFINITY});
    model->weight.mutable_grad() = torch::ones({2, 3});
    CHECK_THROWS_WITH(clip_grad_norm_(model->named_parameters(), 1.0, 2.0, true), Contains("'bias'"));
    CHECK_NOTHROW(clip_grad_norm_(model->named_parameters(), 1.0, 2.0, false));
  }
  SECTION("bad arguments") {
    CHECK_THROWS_WITH(clip_grad_norm_(params, -1.0), Contains("max_norm"));
    CHECK_THROWS_WITH(clip_grad_norm_(params, 1.0, 0.0), Contains("norm_type"));
  }
}

TEST_CASE("clip_grad_norm_'s fused path gives the same bits with 1, 2 and 3 threads", "[grad][clip][threads]") {
  // Tensors spanning several 32 K-element chunks, so that the chunks' partial sums come from different threads.
  const std::vector<int64_t> sizes{100003, 3, 70001, 65536};
  const int before = at::get_num_threads();
  for (const double norm_type : {2.0, 1.0, 3.0, static_cast<double>(INFINITY)}) {
    DYNAMIC_SECTION("norm_type " << norm_type) {
      std::vector<at::Tensor> norms;
      std::vector<std::vector<at::Tensor>> clipped;
      for (const int threads : {1, 2, 3}) {
        at::set_num_threads(threads);
        torch::manual_seed(7);
        std::vector<at::Tensor> params;
        for (const int64_t n : sizes) {
          at::Tensor p = torch::zeros({n}).requires_grad_();
          p.mutable_grad() = torch::randn({n});
          params.push_back(p);
        }
        norms.push_back(clip_grad_norm_(params, 1.0, norm_type));
        std::vector<at::Tensor> grads;
        for (const auto& p : params) {
          grads.push_back(p.grad());
        }
        clipped.push_back(grads);
      }
      at::set_num_threads(before);
      for (size_t r = 1; r < norms.size(); ++r) {
        INFO("threads run " << r);
        CHECK(torch::equal(norms[0], norms[r]));
        for (size_t i = 0; i < sizes.size(); ++i) {
          CHECK(torch::equal(clipped[0][i], clipped[r][i]));
        }
      }
    }
  }
  at::set_num_threads(before);
}

TEST_CASE("clip_grads_with_norm_ with the norm from grad_norm equals clip_grad_norm_ bit for bit", "[grad][clip]") {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (const bool fused : {true, false}) {  // contiguous CPU gradients, and strided ones (the foreach path)
      INFO("dtype " << dtype << (fused ? " fused" : " foreach"));
      torch::manual_seed(3);
      std::vector<at::Tensor> a;
      std::vector<at::Tensor> b;
      for (const int64_t n : {7, 300, 4099}) {
        at::Tensor p = torch::randn({n}, dtype).requires_grad_();
        const at::Tensor g = torch::randn({n, 2}, dtype) * 5;
        p.mutable_grad() = fused ? g.select(1, 0).contiguous() : g.select(1, 0);
        at::Tensor q = p.detach().clone().requires_grad_();
        q.mutable_grad() = fused ? g.select(1, 0).contiguous() : g.clone().select(1, 0);
        a.push_back(p);
        b.push_back(q);
      }
      const at::Tensor total = clip_grad_norm_(a, 1.5);
      trainkit::grad::clip_grads_with_norm_(b, 1.5, trainkit::grad::grad_norm(b));
      for (size_t i = 0; i < a.size(); ++i) {
        CHECK(torch::equal(a[i].grad(), b[i].grad()));
      }
      CHECK(total.item<double>() > 1.5);  // the clip took effect
      CHECK(trainkit::grad::grad_norm(b).item<double>() == Approx(1.5).epsilon(1e-5));
    }
  }
  CHECK_THROWS_WITH(trainkit::grad::clip_grads_with_norm_({}, -1.0, torch::ones({})), Contains("invalid max_norm"));
}
