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
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(foreach);
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
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, foreach);
}

namespace {

detail::MomentumHyper hyper_of(const LarsOptions& o) {
  detail::MomentumHyper h;
  h.lr = o.lr();
  h.momentum = o.momentum();
  h.dampening = o.dampening();
  h.weight_decay = o.weight_decay();
  h.nesterov = o.nesterov();
  h.adapt = o.weight_decay() != 0 || o.always_adapt();
  h.trust_coefficient = o.trust_coefficient();
  h.eps = o.eps();
  h.trust_clip = o.trust_clip();
  h.fused = o.fused();
  h.foreach = o.foreach();
  return h;
}

}  // namespace

bool register_lars_optimizer() {
  register_optimizer(
      detail::momentum_binding<Lars>("lars", "Weight decay, inside the adapted update")
          .bind(TRAINKIT_OPTION(trust_coefficient), positive(), "Trust coefficient (timm's trust_coeff)")
          .bind(TRAINKIT_OPTION(eps), non_negative(), "Term added to the trust ratio's denominator")
          .bind(TRAINKIT_OPTION(trust_clip), "LARC: clip the ratio so that the effective LR never exceeds lr")
          .bind(TRAINKIT_OPTION(always_adapt), "Adapt every parameter, also those with weight_decay 0")
          .bind(TRAINKIT_OPTION(fused), detail::kFusedDoc)
          .bind(TRAINKIT_OPTION(foreach), detail::kForeachDoc)
          .entry());
  return true;
}

void Lars::validate(const LarsOptions& options) { detail::validate_momentum(hyper_of(options), kName); }

void Lars::update(const at::Tensor& inv_scale) {
  detail::momentum_update(*this, [](const LarsOptions& o) { return hyper_of(o); }, {inv_scale, {}, {}});
}

}  // namespace trainkit::optim
