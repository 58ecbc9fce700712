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
}

void SgdOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, dampening);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, nesterov);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, fused);
}

void SgdParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
}

void SgdParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, momentum_buffer);
}

namespace {

detail::MomentumHyper hyper_of(const SgdOptions& o) {
  return {o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov(), o.maximize(),
          /*adapt=*/false, 0.0, 0.0, false, o.fused()};
}

}  // namespace

Sgd::Sgd(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, SgdOptions defaults)
    : Optimizer(param_groups, std::make_unique<SgdOptions>(defaults)) {
  detail::restore_group_options(*this, param_groups);
  detail::check_group_options<SgdOptions>(*this, "Sgd", "trainkit::optim::SgdOptions");
  detail::validate_momentum(hyper_of(defaults), "Sgd");
  for (const auto& group : param_groups_) {
    detail::validate_momentum(hyper_of(static_cast<const SgdOptions&>(group.options())), "Sgd");
  }
}

Sgd::Sgd(std::vector<at::Tensor> params, SgdOptions defaults)
    : Sgd({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

at::Tensor Sgd::step(LossClosure closure) {
  at::Tensor loss = detail::run_closure(closure);
  detail::momentum_step<SgdParamState, SgdOptions>(*this, hyper_of, "Sgd", {});
  return loss;
}

void Sgd::step_scaled(const at::Tensor& inv_scale, const at::Tensor& found_inf) {
  if (detail::cpu_scalar(found_inf, 0.0) == 0.0) {
    detail::momentum_step<SgdParamState, SgdOptions>(*this, hyper_of, "Sgd", inv_scale);
  }
}

void Sgd::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<SgdParamState, SgdOptions>(archive, *this);
}

void Sgd::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<SgdParamState, SgdOptions>(archive, *this);
}

}  // namespace trainkit::optim
