// optim::OffloadOptimizer with its parameters on the test accelerator (device/testdev.h): the state and the
// step on the CPU, the result equal to the same optimizer stepping host parameters, the transfers of a step
// counted in bytes, save/load resuming bitwise, and the errors naming the parameter.
#include <set>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "device/testdev.h"
#include "support.h"
#include "trainkit/app/config.h"
#include "trainkit/app/run.h"
#include "trainkit/compat.h"
#include "trainkit/optim.h"

using Catch::Matchers::Contains;
using trainkit::optim::OffloadOptimizer;
using trainkit::test::test_device;
using trainkit::test::TransferCounter;

namespace offload_test {

/// A two-layer net as plain tensors (w1, b1, w2, b2) and a fifth parameter the loss never uses (no gradient).
std::vector<at::Tensor> offload_params(const c10::Device& device, at::ScalarType dtype = at::kDouble) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  std::vector<at::Tensor> params;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{7, 5}, {7}, {3, 7}, {3}, {4}}) {
    params.push_back(at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble)).mul_(0.5).to(device, dtype)
                         .detach().requires_grad_(true));
  }
  return params;
}

/// Batch `step` of a fixed data set on `device`.
std::pair<at::Tensor, at::Tensor> offload_batch(int64_t step, const c10::Device& device, at::ScalarType dtype) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(100 + static_cast<uint64_t>(step));
  const auto o = at::TensorOptions().dtype(at::kDouble);
  return {at::randn({6, 5}, gen, o).to(device, dtype), at::randn({6, 3}, gen, o).to(device, dtype)};
}

/// One forward and backward of batch `step` (fresh gradients).
void offload_backward(const std::vector<at::Tensor>& p, torch::optim::Optimizer& opt, int64_t step) {
  opt.zero_grad();
  const auto [x, y] = offload_batch(step, p[0].device(), p[0].scalar_type());
  const at::Tensor h = at::tanh(at::addmm(p[1], x, p[0].t()));
  at::mse_loss(at::addmm(p[3], h, p[2].t()), y).backward();
}

using OffloadListFactory = trainkit::optim::HostOptimizerListFactory;

OffloadListFactory offload_factory(const std::string& name) {
  return [name](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    using namespace trainkit::optim;
    if (name == "adam") return std::make_unique<Adam>(params, AdamOptions(0.05).weight_decay(0.01));
    if (name == "adamw") return std::make_unique<AdamW>(params, AdamWOptions(0.05).weight_decay(0.1).amsgrad(true));
    return std::make_unique<Sgd>(params, SgdOptions(0.1).momentum(0.9).nesterov(true));
  };
}

double offload_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, (a[i].detach().cpu().to(at::kDouble) - b[i].detach().cpu().to(at::kDouble)).abs().max().item<double>());
  }
  return d;
}

/// The devices of every tensor in `opt`'s saved state.
void offload_collect_devices(torch::serialize::InputArchive& archive, std::set<std::string>& out) {
  for (const auto& key : archive.keys()) {
    at::Tensor t;
    if (archive.try_read(key, t)) {
      if (t.defined()) out.insert(t.device().str());
      continue;
    }
    torch::serialize::InputArchive nested;
    if (archive.try_read(key, nested)) offload_collect_devices(nested, out);
  }
}

/// What `opt.save()` writes, read back (tensors on the devices they were saved from).
void offload_saved(const torch::optim::Optimizer& opt, torch::serialize::InputArchive& in) {
  torch::serialize::OutputArchive out;
  opt.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  in.load_from(bytes);
}

std::set<std::string> offload_state_devices(const torch::optim::Optimizer& opt) {
  torch::serialize::InputArchive in;
  offload_saved(opt, in);
  std::set<std::string> devices;
  offload_collect_devices(in, devices);
  return devices;
}

}  // namespace offload_test

TEST_CASE("OffloadOptimizer on the test device: Adam, AdamW and SGD-momentum with the state on the CPU equal the "
          "same optimizer stepping host parameters, an LR set between steps included",
          "[testdev][optim][offload]") {
  using namespace offload_test;
  for (const std::string name : {"adam", "adamw", "sgd"}) {
    DYNAMIC_SECTION(name) {
      const auto dev = offload_params(test_device());
      const auto host = offload_params(c10::kCPU);
      OffloadOptimizer offload(dev, offload_factory(name));
      auto reference = offload_factory(name)(host);
      for (int64_t step = 0; step < 5; ++step) {
        if (step == 3) {  // what a scheduler does: set the group's LR on the optimizer it drives
          offload.param_groups()[0].options().set_lr(0.02);
          reference->param_groups()[0].options().set_lr(0.02);
        }
        offload_backward(dev, offload, step);
        offload_backward(host, *reference, step);
        offload.step();
        reference->step();
      }
      // The test can fail: training moved the parameters, but not the one without a gradient.
      CHECK(offload_difference(host, offload_params(c10::kCPU)) > 1e-2);
      CHECK(torch::equal(dev[4].cpu(), offload_params(c10::kCPU)[4]));
      CHECK(offload_difference(dev, host) <= 1e-12);
      for (const auto& p : dev) CHECK(p.device() == test_device());
      // The state: keyed by the device parameters that had a gradient, its tensors on the CPU.
      CHECK(offload.state().size() == 4);
      for (size_t i = 0; i < 4; ++i) CHECK(offload.state().count(trainkit::compat::param_state_key(dev[i])) == 1);
      CHECK(offload_state_devices(offload) == std::set<std::string>{"cpu"});
      CHECK(offload.master(0, 2).device().is_cpu());
      CHECK(torch::equal(offload.master(0, 2), dev[2].cpu()));
    }
  }
}

TEST_CASE("OffloadOptimizer on the test device: a step moves each gradient byte down once and each parameter byte up "
          "once, nothing else",
          "[testdev][optim][offload]") {
  using namespace offload_test;
  for (const auto dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
    DYNAMIC_SECTION(c10::toString(dtype)) {
      const auto dev = offload_params(test_device(), dtype);
      OffloadOptimizer offload(dev, offload_factory("adam"));
      offload_backward(dev, offload, 0);
      offload.step();  // the first step also reads the masters
      int64_t grad_bytes = 0;
      int64_t param_bytes = 0;
      for (size_t i = 0; i < 4; ++i) {  // the fifth parameter has no gradient: it stays where it is
        grad_bytes += static_cast<int64_t>(dev[i].nbytes());
        param_bytes += static_cast<int64_t>(dev[i].nbytes());
      }
      for (int64_t step = 1; step < 3; ++step) {
        offload_backward(dev, offload, step);
        const at::Tensor before = dev[0].detach().clone();
        TransferCounter counter;
        offload.step();
        INFO("step " << step << ": host reads " << counter.causes());
        CHECK(counter.to_host() == 4);
        CHECK(counter.bytes_to_host() == grad_bytes);
        CHECK(counter.to_device() == 4);
        CHECK(counter.bytes_to_device() == param_bytes);
        CHECK_FALSE(torch::equal(before.cpu(), dev[0].detach().cpu()));
      }
      // bfloat16 parameters: float32 masters and state on the host, the parameters rounded once per step.
      CHECK(offload.master(0, 0).scalar_type() == trainkit::optim::internal::state_dtype(dtype));
      CHECK(torch::equal(offload.master(0, 0).to(dtype), dev[0].detach().cpu()));
    }
  }
}

TEST_CASE("OffloadOptimizer: save and load resume bitwise, the archive is the host optimizer's, and state saved on "
          "the device comes to the CPU",
          "[testdev][optim][offload]") {
  using namespace offload_test;
  // A: 6 steps in one go.
  const auto whole = offload_params(test_device());
  OffloadOptimizer a(whole, offload_factory("adam"));
  for (int64_t step = 0; step < 6; ++step) {
    offload_backward(whole, a, step);
    a.step();
  }
  // B: 3 steps, saved; C: an optimizer that has stepped other parameters loads B's parameters and state,
  // then continues to step 6.
  const auto first = offload_params(test_device());
  OffloadOptimizer b(first, offload_factory("adam"));
  for (int64_t step = 0; step < 3; ++step) {
    offload_backward(first, b, step);
    b.step();
  }
  const auto second = offload_params(test_device());
  OffloadOptimizer c(second, offload_factory("adam"));
  offload_backward(second, c, 5);
  c.step();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < second.size(); ++i) second[i].copy_(first[i]);
  }
  torch::serialize::InputArchive in;
  offload_saved(b, in);
  c.load(in);
  for (int64_t step = 3; step < 6; ++step) {
    offload_backward(second, c, step);
    c.step();
  }
  CHECK(offload_difference(whole, offload_params(c10::kCPU)) > 1e-2);
  for (size_t i = 0; i < whole.size(); ++i) CHECK(torch::equal(whole[i].cpu(), second[i].cpu()));

  SECTION("the archive loads into the host optimizer without offload, which continues alike") {
    auto host = offload_params(c10::kCPU);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < host.size(); ++i) host[i].copy_(first[i].cpu());
    }
    auto plain = offload_factory("adam")(host);
    torch::serialize::InputArchive again;
    offload_saved(b, again);
    plain->load(again);
    for (int64_t step = 3; step < 6; ++step) {
      offload_backward(host, *plain, step);
      plain->step();
    }
    CHECK(offload_difference(host, whole) <= 1e-12);
  }
  SECTION("state saved by Adam stepping on the device loads onto the CPU") {
    auto on_device = offload_params(test_device());
    trainkit::optim::Adam adam(on_device, trainkit::optim::AdamOptions(0.05).weight_decay(0.01));
    offload_backward(on_device, adam, 0);
    adam.step();
    REQUIRE(offload_state_devices(adam).count(test_device().str()) == 1);  // its moments live on the device
    torch::serialize::InputArchive device_in;
    offload_saved(adam, device_in);
    OffloadOptimizer d(on_device, offload_factory("adam"));
    d.load(device_in);
    CHECK(offload_state_devices(d) == std::set<std::string>{"cpu"});
    offload_backward(on_device, d, 1);
    d.step();  // steps with the fused CPU kernel over host state
    CHECK(d.state().size() == 4);
  }
}

TEST_CASE("OffloadOptimizer: a param group added between steps gets host masters and steps as the host optimizer's",
          "[testdev][optim][offload]") {
  using namespace offload_test;
  const auto dev = offload_params(test_device());
  const auto host = offload_params(c10::kCPU);
  OffloadOptimizer offload({dev[0], dev[1]}, offload_factory("adam"));
  auto reference = offload_factory("adam")({host[0], host[1]});
  for (int64_t step = 0; step < 5; ++step) {
    if (step == 2) {
      offload.add_param_group(torch::optim::OptimizerParamGroup({dev[2], dev[3]}));
      reference->add_param_group(torch::optim::OptimizerParamGroup({host[2], host[3]}));
    }
    offload_backward(dev, offload, step);
    offload_backward(host, *reference, step);
    offload.step();
    reference->step();
  }
  CHECK(offload.inner().param_groups().size() == 2);
  CHECK(offload.master(1, 1).device().is_cpu());
  // Added after the last step: saved with its group (the host optimizer's groups follow at save).
  offload.add_param_group(torch::optim::OptimizerParamGroup({dev[4]}));
  torch::serialize::InputArchive saved;
  offload_saved(offload, saved);
  CHECK(offload.inner().param_groups().size() == 3);
  CHECK(offload_difference(host, offload_params(c10::kCPU)) > 1e-2);
  CHECK(offload_difference(dev, host) <= 1e-12);
}

TEST_CASE("OffloadOptimizer: a sparse gradient, parameters on two devices and a factory that steps other tensors are "
          "errors naming the parameter",
          "[testdev][optim][offload]") {
  using namespace offload_test;
  SECTION("sparse gradient") {
    auto params = offload_params(c10::kCPU);
    OffloadOptimizer offload(params, offload_factory("sgd"));
    params[1].mutable_grad() = at::zeros({7}, at::kDouble).to_sparse();
    CHECK_THROWS_WITH(offload.step(), Contains("parameter 1 of param group 0 (shape [7]) has a sparse gradient"));
  }
  SECTION("two devices") {
    auto params = offload_params(test_device());
    params[3] = params[3].detach().to(test_device(1)).requires_grad_(true);
    CHECK_THROWS_WITH(OffloadOptimizer(params, offload_factory("adam")),
                      Contains("parameter 3 of param group 0 (shape [3]) is on testdev:1, parameter 0 of param group 0 "
                               "on testdev:0"));
  }
  SECTION("a factory over other tensors") {
    const auto params = offload_params(test_device());
    const auto others = offload_params(c10::kCPU);
    CHECK_THROWS_WITH(OffloadOptimizer(params, [&](std::vector<at::Tensor> host) {
                        host[2] = others[2];
                        return offload_factory("adam")(host);
                      }),
                      Contains("holds another tensor (shape [3, 7]) in place of the host master of parameter 2 of "
                               "param group 0"));
    CHECK_THROWS_WITH(OffloadOptimizer({torch::optim::OptimizerParamGroup({params[0]}),
                                        torch::optim::OptimizerParamGroup({params[1]})},
                                       [](std::vector<torch::optim::OptimizerParamGroup> groups) {
                                         return std::make_unique<trainkit::optim::Adam>(groups.front().params());
                                       }),
                      Contains("the factory's optimizer has 1 param groups; it must make one of each group it is "
                               "given (2)"));
  }
  SECTION("integer parameter") {
    CHECK_THROWS_WITH(OffloadOptimizer({at::zeros({2}, at::kLong).to(test_device())}, offload_factory("sgd")),
                      Contains("parameter 0 of param group 0 (shape [2]) has dtype Long"));
  }
}

namespace offload_test {

/// The parameters after one epoch (`fit`; else before it) of `trainkit train`'s stack (a small MLP, Adam, clipping, 2-step
/// accumulation, a per-step scheduler) with `extra` overrides.
std::vector<at::Tensor> offload_train_job(const std::vector<std::string>& extra, bool expect_offload, bool fit = true) {
  trainkit::test::register_test_device();  // before the config names "testdev"
  trainkit::test::TempDir tmp("offload-job");
  std::vector<std::string> overrides = {
      "data.limit_train=400", "data.limit_test=100", "data.val_size=100", "train.batch_size=50",
      "model.name=\"mlp\"", "model.hidden=16", "train.epochs=1", "grad.clip_norm=1.0",
      "grad.accumulation_steps=2", "optimizer.name=\"adam\"", "optimizer.lr=0.01", "log.progress=\"lines\"",
      "scheduler.type=\"CosineAnnealingLR\"", "scheduler.T_max=4", "scheduler.interval=\"step\""};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  trainkit::app::Run run = trainkit::app::build_run(trainkit::app::parse_config("", "offload.toml", overrides),
                                                    "offload.toml", trainkit::app::RunOptions().dir(tmp.str("run")));
  auto* offload = dynamic_cast<OffloadOptimizer*>(run.optimizer.get());
  CHECK((offload != nullptr) == expect_offload);
  if (fit) run.trainer->fit(*run.train, run.val.get());
  if (offload != nullptr && fit) {
    CHECK(offload->device() == run.device);
    CHECK(offload_state_devices(*offload) == std::set<std::string>{"cpu"});
  }
  std::vector<at::Tensor> params;
  for (const auto& p : run.model->parameters()) params.push_back(p.detach().cpu());
  return params;
}

}  // namespace offload_test

TEST_CASE("trainkit train with [zero] offload_optimizer = true on the test device equals the run without offload",
          "[testdev][optim][offload][app]") {
  using namespace offload_test;
  // Without offload Adam steps on the device through its foreach path, with offload through the fused CPU
  // kernel: float32 results to rounding.
  const auto on_device = offload_train_job({"train.device=\"testdev\""}, false);
  const auto offloaded = offload_train_job({"train.device=\"testdev\"", "zero.offload_optimizer=true"}, true);
  CHECK(offload_difference(on_device, offloaded) <= 1e-5);
  // The test can fail: the run moved the parameters.
  const auto untrained = offload_train_job({"train.device=\"testdev\""}, false, /*fit=*/false);
  CHECK(offload_difference(on_device, untrained) > 1e-3);
}
