#include "trainkit/optim/sgd.h"

#include <torch/optim/serialize.h>

#include "optim/detail/momentum.h"

namespace trainkit::optim {

void SgdParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
}

void SgdParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, momentum_buffer);
}

namespace {

detail::MomentumHyper hyper_of(const SgdOptions& o) {
  detail::MomentumHyper h = detail::momentum_hyper(o);
  h.maximize = o.maximize();
  h.aten_fused = o.aten_fused();
  return h;
}

}  // namespace

bool register_sgd_optimizer() {
  register_optimizer(OptimizerBinding<Sgd>("sgd").entry());
  return true;
}

void Sgd::update(const at::Tensor& inv_scale) {
  detail::momentum_update(*this, [](const SgdOptions& o) { return hyper_of(o); }, {inv_scale, {}, {}});
}

void Sgd::update_found_inf(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  detail::momentum_update(*this, [](const SgdOptions& o) { return hyper_of(o); }, {{}, grad_scale, found_inf});
}

bool Sgd::takes_found_inf() const { return all_groups_aten_fused(); }

}  // namespace trainkit::optim
