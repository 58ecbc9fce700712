// Activation checkpointing: gradients bitwise equal to the plain model (float64 with dropout and batch norm;
// bf16 CPU autocast), checkpoint_sequential equal to the Sequential, recomputation counts, inputs without
// requires_grad, BatchNorm statistics updated once, and one AccumulateGrad hook call per parameter.
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include "support.h"
#include "trainkit/compat.h"
#include "trainkit/nn/activation_checkpoint.h"

using trainkit::nn::checkpoint;
using trainkit::nn::checkpoint_options_for;
using trainkit::nn::checkpoint_sequential;

namespace {

/// Linear → BN → ReLU → Dropout, twice, then a linear head: 9 modules, float64.
torch::nn::Sequential make_net(int64_t seed) {
  torch::manual_seed(seed);
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(),
                            torch::nn::Dropout(0.3), torch::nn::Linear(16, 16), torch::nn::BatchNorm1d(16),
                            torch::nn::ReLU(), torch::nn::Dropout(0.3), torch::nn::Linear(16, 4));
  net->to(torch::kFloat64);
  return net;
}

struct StepResult {
  at::Tensor output;
  std::vector<at::Tensor> grads;
  std::vector<at::Tensor> buffers;
  at::Tensor input_grad;
  at::Tensor next_draw;  // a draw after backward: the RNG state checkpointing leaves behind
};

/// One forward/backward; `segments` 0 = plain forward, -1 = checkpoint() of the whole net.
StepResult step(torch::nn::Sequential& net, const at::Tensor& input, int64_t segments) {
  torch::manual_seed(7);
  at::Tensor out;
  if (segments == 0) {
    out = net->forward(input);
  } else if (segments < 0) {
    out = checkpoint([&](const at::Tensor& x) { return net->forward(x); }, input, checkpoint_options_for(*net));
  } else {
    out = checkpoint_sequential(net, segments, input);
  }
  (out.pow(2).sum() + out.sum()).backward();
  StepResult r{out.detach(), {}, {}, input.grad(), torch::rand({4}, torch::kFloat64)};
  for (const auto& p : net->parameters()) {
    r.grads.push_back(p.grad().clone());
  }
  for (const auto& b : net->buffers()) {
    r.buffers.push_back(b.clone());
  }
  return r;
}

void require_same(const StepResult& a, const StepResult& b) {
  REQUIRE(torch::equal(a.output, b.output));
  REQUIRE(a.grads.size() == b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(torch::equal(a.grads[i], b.grads[i]));  // bitwise
  }
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    INFO("buffer " << i);
    REQUIRE(torch::equal(a.buffers[i], b.buffers[i]));
  }
  REQUIRE(a.input_grad.defined() == b.input_grad.defined());
  if (a.input_grad.defined()) {
    REQUIRE(torch::equal(a.input_grad, b.input_grad));
  }
  REQUIRE(torch::equal(a.next_draw, b.next_draw));
}

/// Counts its forward calls; an affine map so it has a parameter.
struct CountingImpl : torch::nn::Module {
  explicit CountingImpl(int64_t* calls) : calls_(calls) { linear = register_module("linear", torch::nn::Linear(6, 6)); }
  at::Tensor forward(const at::Tensor& x) {
    ++*calls_;
    return torch::tanh(linear->forward(x));
  }
  torch::nn::Linear linear{nullptr};
  int64_t* calls_;
};
TORCH_MODULE(Counting);

struct CountHook : torch::autograd::FunctionPostHook {
  explicit CountHook(int64_t* calls) : calls_(calls) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    ++*calls_;
    return outputs;
  }
  int64_t* calls_;
};

}  // namespace

TEST_CASE("checkpoint: float64 gradients with dropout and batch norm are bitwise those without",
          "[nn][checkpoint]") {
  const at::Tensor x0 = torch::randn({32, 8}, torch::kFloat64);
  for (const bool input_grad : {false, true}) {
    for (const int64_t segments : {-1, 1, 2, 3, 9}) {
      INFO("input requires grad " << input_grad << ", segments " << segments);
      auto plain = make_net(3);
      auto ckpt = make_net(3);
      const at::Tensor xa = x0.clone().requires_grad_(input_grad);
      const at::Tensor xb = x0.clone().requires_grad_(input_grad);
      const StepResult a = step(plain, xa, 0);
      const StepResult b = step(ckpt, xb, segments);
      require_same(a, b);
      // BatchNorm's statistics were updated once (as without checkpointing), not once more by the recomputation.
      const auto bn = ckpt->ptr(1)->as<torch::nn::BatchNorm1d>();
      REQUIRE(bn->num_batches_tracked.item<int64_t>() == 1);
    }
  }
}

TEST_CASE("checkpoint: the second step with the same modules still matches", "[nn][checkpoint]") {
  auto plain = make_net(5);
  auto ckpt = make_net(5);
  const at::Tensor x = torch::randn({16, 8}, torch::kFloat64);
  for (int i = 0; i < 2; ++i) {
    for (auto& p : plain->parameters()) {
      p.mutable_grad() = at::Tensor();
    }
    for (auto& p : ckpt->parameters()) {
      p.mutable_grad() = at::Tensor();
    }
    require_same(step(plain, x, 0), step(ckpt, x, 3));
  }
}

TEST_CASE("checkpoint: bf16 CPU autocast is reapplied during the recomputation", "[nn][checkpoint][amp]") {
  const at::Tensor x = torch::randn({16, 8});
  const auto run = [&](int64_t segments) {
    auto net = make_net(11);
    net->to(torch::kFloat32);
    trainkit::compat::set_autocast_dtype(c10::kCPU, c10::kBFloat16);
    trainkit::compat::set_autocast_enabled(c10::kCPU, true);
    trainkit::compat::autocast_increment_nesting();
    at::Tensor out;
    torch::manual_seed(7);
    out = segments == 0 ? net->forward(x) : checkpoint_sequential(net, segments, x);
    trainkit::compat::set_autocast_enabled(c10::kCPU, false);
    if (trainkit::compat::autocast_decrement_nesting() == 0) {
      trainkit::compat::autocast_clear_cache();
    }
    REQUIRE(out.scalar_type() == torch::kBFloat16);  // autocast really ran the linears in bf16
    out.to(torch::kFloat32).pow(2).sum().backward();  // backward outside the autocast region, as usual
    std::vector<at::Tensor> grads;
    for (const auto& p : net->parameters()) {
      grads.push_back(p.grad().clone());
    }
    return grads;
  };
  const auto plain = run(0);
  for (const int64_t segments : {2, 3}) {
    const auto ckpt = run(segments);
    for (size_t i = 0; i < plain.size(); ++i) {
      INFO("segments " << segments << ", parameter " << i);
      REQUIRE(torch::equal(plain[i], ckpt[i]));
    }
  }
  REQUIRE_FALSE(trainkit::compat::autocast_enabled(c10::kCPU));
}

TEST_CASE("checkpoint_sequential: recomputes the modules of every segment but the last, once",
          "[nn][checkpoint]") {
  const int64_t n = 8;
  for (const int64_t segments : {1, 2, 3, 4, 8}) {
    int64_t calls = 0;
    torch::manual_seed(0);
    torch::nn::Sequential net;
    for (int64_t i = 0; i < n; ++i) {
      net->push_back(Counting(&calls));
    }
    const at::Tensor x = torch::randn({3, 6});
    const at::Tensor out = checkpoint_sequential(net, segments, x);
    REQUIRE(calls == n);
    out.sum().backward();
    INFO("segments " << segments);
    REQUIRE(calls == n + (segments - 1) * (n / segments));
    for (const auto& p : net->parameters()) {
      REQUIRE(p.grad().defined());
    }
  }
}

TEST_CASE("checkpoint: inputs without requires_grad, several inputs and outputs, grad disabled",
          "[nn][checkpoint]") {
  torch::manual_seed(1);
  torch::nn::Linear lin(4, 3);
  const at::Tensor a = torch::randn({5, 4});
  const at::Tensor b = torch::randn({5, 3}).requires_grad_();
  const auto fn = [&](const std::vector<at::Tensor>& in) {
    const at::Tensor h = lin->forward(in[0]) * in[1];
    return std::vector<at::Tensor>{h.sum(1), h.argmax(1)};  // the argmax is not differentiable
  };
  SECTION("gradients of the parameters and of the input that requires grad") {
    const auto plain = fn({a, b});
    plain[0].pow(2).sum().backward();
    const at::Tensor wg = lin->weight.grad().clone();
    const at::Tensor bg = b.grad().clone();
    lin->weight.mutable_grad() = at::Tensor();
    lin->bias.mutable_grad() = at::Tensor();
    b.mutable_grad() = at::Tensor();
    const auto out = checkpoint(fn, {a, b}, checkpoint_options_for(*lin));
    REQUIRE(out[1].scalar_type() == torch::kLong);
    REQUIRE_FALSE(out[1].requires_grad());
    REQUIRE(torch::equal(out[1], plain[1]));
    out[0].pow(2).sum().backward();
    REQUIRE(torch::equal(lin->weight.grad(), wg));
    REQUIRE(torch::equal(b.grad(), bg));
  }
  SECTION("no input requires grad: the parameters still get their gradients") {
    const at::Tensor c = b.detach();
    const auto out = checkpoint(fn, {a, c}, checkpoint_options_for(*lin));
    REQUIRE(out[0].requires_grad());
    out[0].sum().backward();
    REQUIRE(lin->weight.grad().defined());
    REQUIRE(lin->weight.grad().abs().sum().item<double>() > 0);
  }
  SECTION("grad disabled: a plain call, no graph") {
    torch::NoGradGuard no_grad;
    const auto out = checkpoint(fn, {a, b}, checkpoint_options_for(*lin));
    REQUIRE_FALSE(out[0].requires_grad());
  }
  SECTION("invalid segment counts are rejected") {
    torch::nn::Sequential net(torch::nn::Linear(4, 4), torch::nn::ReLU());
    REQUIRE_THROWS_AS(checkpoint_sequential(net, 0, a), std::invalid_argument);
    REQUIRE_THROWS_AS(checkpoint_sequential(net, 3, a), std::invalid_argument);
  }
}

TEST_CASE("checkpoint: each parameter's AccumulateGrad (DDP's ready hook) runs once per backward",
          "[nn][checkpoint]") {
  auto net = make_net(2);
  std::vector<int64_t> calls(net->parameters().size(), 0);
  std::vector<decltype(torch::autograd::impl::grad_accumulator(at::Tensor()))> accumulators;  // parameters hold them weakly
  auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    acc->add_post_hook(std::make_unique<CountHook>(&calls[i]));
    accumulators.push_back(acc);
  }
  const at::Tensor x = torch::randn({8, 8}, torch::kFloat64);
  checkpoint_sequential(net, 3, x).sum().backward();
  for (size_t i = 0; i < calls.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(calls[i] == 1);
  }
}
