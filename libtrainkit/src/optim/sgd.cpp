#include "trainkit/optim/sgd.h"

#include <torch/optim/serialize.h>

#include "optim/detail/momentum.h"

namespace trainkit::optim {

void SgdOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(dampening);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(nesterov);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(fused);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(foreach);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(aten_fused);
}

void SgdOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, dampening);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, nesterov);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, fused);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, foreach);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, aten_fused);
}

void SgdParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
}

void SgdParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, momentum_buffer);
}

namespace {

detail::MomentumHyper hyper_of(const SgdOptions& o) {
  detail::MomentumHyper h;
  h.lr = o.lr();
  h.momentum = o.momentum();
  h.dampening = o.dampening();
  h.weight_decay = o.weight_decay();
  h.nesterov = o.nesterov();
  h.maximize = o.maximize();
  h.fused = o.fused();
  h.foreach = o.foreach();
  h.aten_fused = o.aten_fused();
  return h;
}

}  // namespace

bool register_sgd_optimizer() {
  register_optimizer(detail::momentum_binding<Sgd>("sgd", "L2 penalty added to the gradient")
                         .bind(TRAINKIT_OPTION(maximize), "Maximize the objective instead of minimizing it")
                         .bind(TRAINKIT_OPTION(fused), detail::kFusedDoc)
                         .bind(TRAINKIT_OPTION(foreach), detail::kForeachDoc)
                         .bind(TRAINKIT_OPTION(aten_fused), detail::kAtenFusedDoc)
                         .entry());
  return true;
}

void Sgd::validate(const SgdOptions& options) { detail::validate_momentum(hyper_of(options), kName); }

void Sgd::update(const at::Tensor& inv_scale) {
  detail::momentum_update(*this, [](const SgdOptions& o) { return hyper_of(o); }, {inv_scale, {}, {}});
}

void Sgd::update_found_inf(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  detail::momentum_update(*this, [](const SgdOptions& o) { return hyper_of(o); }, {{}, grad_scale, found_inf});
}

bool Sgd::takes_found_inf() const { return all_groups_aten_fused(); }

}  // namespace trainkit::optim
