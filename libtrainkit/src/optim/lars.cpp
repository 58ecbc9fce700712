#include "trainkit/optim/lars.h"

#include <torch/optim/serialize.h>

#include "optim/detail/momentum.h"

namespace trainkit::optim {

void LarsOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(dampening);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(nesterov);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(trust_coefficient);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(trust_clip);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(always_adapt);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(fused);
}

void LarsOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, dampening);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, nesterov);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, trust_coefficient);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, trust_clip);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, always_adapt);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, fused);
}

void LarsParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
}

void LarsParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, momentum_buffer);
}

namespace {

detail::MomentumHyper hyper_of(const LarsOptions& o) {
  return {o.lr(),
          o.momentum(),
          o.dampening(),
          o.weight_decay(),
          o.nesterov(),
          /*maximize=*/false,
          /*adapt=*/o.weight_decay() != 0 || o.always_adapt(),
          o.trust_coefficient(),
          o.eps(),
          o.trust_clip(),
          o.fused()};
}

}  // namespace

Lars::Lars(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, LarsOptions defaults)
    : Optimizer(param_groups, std::make_unique<LarsOptions>(defaults)) {
  detail::restore_group_options(*this, param_groups);
  detail::check_group_options<LarsOptions>(*this, "Lars", "trainkit::optim::LarsOptions");
  detail::validate_momentum(hyper_of(defaults), "Lars");
  for (const auto& group : param_groups_) {
    detail::validate_momentum(hyper_of(static_cast<const LarsOptions&>(group.options())), "Lars");
  }
}

Lars::Lars(std::vector<at::Tensor> params, LarsOptions defaults)
    : Lars({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

at::Tensor Lars::step(LossClosure closure) {
  at::Tensor loss = detail::run_closure(closure);
  detail::momentum_step<LarsParamState, LarsOptions>(*this, hyper_of, "Lars", {});
  return loss;
}

void Lars::step_scaled(const at::Tensor& inv_scale, const at::Tensor& found_inf) {
  if (detail::cpu_scalar(found_inf, 0.0) == 0.0) {
    detail::momentum_step<LarsParamState, LarsOptions>(*this, hyper_of, "Lars", inv_scale);
  }
}

void Lars::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LarsParamState, LarsOptions>(archive, *this);
}

void Lars::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LarsParamState, LarsOptions>(archive, *this);
}

}  // namespace trainkit::optim
