#include "trainkit/optim/lars.h"

#include <torch/optim/serialize.h>

#include "optim/detail/momentum.h"

namespace trainkit::optim {

namespace {

detail::MomentumHyper hyper_of(const LarsOptions& o) {
  detail::MomentumHyper h = detail::momentum_hyper(o);
  h.adapt = o.weight_decay() != 0 || o.always_adapt();
  h.trust_coefficient = o.trust_coefficient();
  h.eps = o.eps();
  h.trust_clip = o.trust_clip();
  return h;
}

}  // namespace

bool register_lars_optimizer() {
  register_optimizer(OptimizerBinding<Lars>("lars").entry());
  return true;
}

void Lars::update(const at::Tensor& inv_scale) {
  detail::momentum_update(*this, [](const LarsOptions& o) { return hyper_of(o); }, {inv_scale, {}, {}});
}

}  // namespace trainkit::optim
