#include "trainkit/optim/adadelta.h"

#include <torch/optim/serialize.h>

#include "optim/detail/common.h"
#include "optim/detail/gather.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

void AdadeltaParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(square_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(acc_delta);
}

void AdadeltaParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, square_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, acc_delta);
}

namespace {

using AdadeltaGroup = detail::Gathered<AdadeltaParamState>;

/// PyTorch's single-tensor Adadelta op for op (`foreach`: the same ops over the whole group). Any device.
void adadelta_tensor_group(const AdadeltaGroup& g, const AdadeltaOptions& o, const at::Tensor& inv_scale, bool foreach) {
  std::vector<at::Tensor> params = g.params;
  auto square_avgs = g.of([](AdadeltaParamState& s) { return s.square_avg(); });
  auto acc_deltas = g.of([](AdadeltaParamState& s) { return s.acc_delta(); });
  const auto grads = detail::effective_grads(g.grads, params, inv_scale, o.maximize(), o.weight_decay(), foreach);
  const double rho = o.rho();
  if (foreach) {
    at::_foreach_mul_(square_avgs, rho);
    at::_foreach_addcmul_(square_avgs, grads, grads, 1 - rho);
    auto std_dev = at::_foreach_add(square_avgs, o.eps());
    at::_foreach_sqrt_(std_dev);
    auto deltas = at::_foreach_add(acc_deltas, o.eps());
    at::_foreach_sqrt_(deltas);
    at::_foreach_div_(deltas, std_dev);
    at::_foreach_mul_(deltas, grads);
    at::_foreach_mul_(acc_deltas, rho);
    at::_foreach_addcmul_(acc_deltas, deltas, deltas, 1 - rho);
    at::_foreach_add_(params, deltas, -o.lr());
    return;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    square_avgs[i].mul_(rho).addcmul_(grads[i], grads[i], 1 - rho);
    const at::Tensor std_dev = square_avgs[i].add(o.eps()).sqrt_();
    const at::Tensor delta = acc_deltas[i].add(o.eps()).sqrt_().div_(std_dev).mul_(grads[i]);
    acc_deltas[i].mul_(rho).addcmul_(delta, delta, 1 - rho);
    params[i].add_(delta, -o.lr());
  }
}

}  // namespace

bool register_adadelta_optimizer() {
  register_optimizer(OptimizerBinding<Adadelta>("adadelta").entry());
  return true;
}

void Adadelta::update(const at::Tensor& inv_scale) {
  const auto init = [](AdadeltaParamState& s, const at::Tensor& p, const AdadeltaOptions& /*o*/) {
    s.square_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    s.acc_delta(at::zeros_like(p, at::MemoryFormat::Preserve));
  };
  detail::for_each_group(*this, init, [&](size_t gi, const AdadeltaOptions& o, AdadeltaGroup& g) {
    adadelta_tensor_group(g, o, inv_scale, internal::use_foreach(o.foreach(), std::nullopt, g.values(), kName, gi));
  });
}

}  // namespace trainkit::optim
