#include "trainkit/optim/rprop.h"

#include <torch/optim/serialize.h>

#include "optim/detail/common.h"
#include "optim/detail/gather.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

void RpropParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(prev);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step_size);
}

void RpropParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, prev);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, step_size);
}

namespace {

using RpropGroup = detail::Gathered<RpropParamState>;

/// PyTorch's single-tensor Rprop op for op (`foreach`: the element-wise arithmetic over the whole group;
/// the masked fills stay per tensor, as in PyTorch's multi-tensor Rprop). Any device, no host reads.
void rprop_tensor_group(const RpropGroup& g, const RpropOptions& o, const at::Tensor& inv_scale, bool foreach) {
  std::vector<at::Tensor> params = g.params;
  auto prevs = g.of([](RpropParamState& s) { return s.prev(); });
  auto step_sizes = g.of([](RpropParamState& s) { return s.step_size(); });
  auto grads = detail::effective_grads(g.grads, params, inv_scale, o.maximize(), 0.0, foreach);
  const auto [etaminus, etaplus] = o.etas();
  const auto [step_min, step_max] = o.step_sizes();
  const size_t n = params.size();
  // sign(g·prev) mapped to the step-size factor: etaplus where > 0, etaminus where < 0, 1 where 0.
  auto signs = foreach ? at::_foreach_sign(at::_foreach_mul(grads, prevs)) : std::vector<at::Tensor>(n);
  for (size_t i = 0; i < n; ++i) {
    if (!foreach) {
      signs[i] = grads[i].mul(prevs[i]).sign();
    }
    signs[i].masked_fill_(signs[i].gt(0), etaplus);
    signs[i].masked_fill_(signs[i].lt(0), etaminus);
    signs[i].masked_fill_(signs[i].eq(0), 1);
  }
  if (foreach) {
    at::_foreach_mul_(step_sizes, signs);
    at::_foreach_clamp_min_(step_sizes, step_min);
    at::_foreach_clamp_max_(step_sizes, step_max);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!foreach) {
      step_sizes[i].mul_(signs[i]).clamp_(step_min, step_max);
    }
    grads[i] = grads[i].clone(at::MemoryFormat::Preserve).masked_fill_(signs[i].eq(etaminus), 0);
  }
  if (foreach) {
    at::_foreach_addcmul_(params, at::_foreach_sign(grads), step_sizes, -1);
    at::_foreach_copy_(prevs, grads);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    params[i].addcmul_(grads[i].sign(), step_sizes[i], -1);
    prevs[i].copy_(grads[i]);
  }
}

}  // namespace

bool register_rprop_optimizer() {
  register_optimizer(OptimizerBinding<Rprop>("rprop").entry());
  return true;
}

void Rprop::update(const at::Tensor& inv_scale) {
  const auto init = [](RpropParamState& s, const at::Tensor& p, const RpropOptions& o) {
    s.prev(at::zeros_like(p, at::MemoryFormat::Preserve));
    s.step_size(at::full_like(p, o.lr(), at::MemoryFormat::Preserve));
  };
  detail::for_each_group(*this, init, [&](size_t gi, const RpropOptions& o, RpropGroup& g) {
    rprop_tensor_group(g, o, inv_scale, internal::use_foreach(o.foreach(), std::nullopt, g.values(), kName, gi));
  });
}

}  // namespace trainkit::optim
