#include "trainkit/optim/lion.h"

#include <torch/optim/serialize.h>

#include "optim/detail/common.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

void LionParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
}

void LionParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg);
}

namespace {

struct LionGroup {
  std::vector<at::Tensor> params, grads, exp_avgs;
};

/// The fused kernel's coefficients: ATen's lerp of weight w is m + w(g - m) below 0.5, else g + (w-1)(g - m).
detail::LionCoef<double> coef_of(const LionOptions& o, double grad_mul) {
  const auto [beta1, beta2] = o.betas();
  const double w1 = 1 - beta1;
  const double w2 = 1 - beta2;
  detail::LionCoef<double> c{};
  c.grad_mul = grad_mul;
  c.decay = 1 - o.lr() * o.weight_decay();
  c.lr = o.lr();
  c.update_from_m = w1 < 0.5;
  c.update_weight = c.update_from_m ? w1 : w1 - 1;
  c.momentum_from_m = w2 < 0.5;
  c.momentum_weight = c.momentum_from_m ? w2 : w2 - 1;
  return c;
}

template <class T>
void lion_fused(const LionGroup& g, const detail::LionCoef<double>& c64) {
  const detail::LionCoef<T> c{static_cast<T>(c64.grad_mul),        static_cast<T>(c64.decay),
                              static_cast<T>(c64.lr),              static_cast<T>(c64.update_weight),
                              static_cast<T>(c64.momentum_weight), c64.update_from_m,
                              c64.momentum_from_m};
  detail::for_each_even(detail::numels_of(g.params), [&](const detail::Chunk& ch) {
    const auto t = static_cast<size_t>(ch.tensor);
    detail::lion_kernel(g.params[t].data_ptr<T>() + ch.begin, g.grads[t].data_ptr<T>() + ch.begin,
                        g.exp_avgs[t].data_ptr<T>() + ch.begin, ch.n, c);
  });
}

/// timm's _single_tensor_lion, op for op. Any device.
void lion_reference(const LionGroup& g, const LionOptions& o) {
  const auto [beta1, beta2] = o.betas();
  for (size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor p = g.params[i];
    const at::Tensor grad = o.maximize() ? -g.grads[i] : g.grads[i];
    at::Tensor m = g.exp_avgs[i];
    p.mul_(1 - o.lr() * o.weight_decay());
    const at::Tensor update = m.lerp(grad, 1 - beta1).sign_();
    p.add_(update, -o.lr());
    m.lerp_(grad, 1 - beta2);
  }
}

/// timm's _multi_tensor_lion: the same ops over the whole group.
void lion_foreach(const LionGroup& g, const LionOptions& o) {
  const auto [beta1, beta2] = o.betas();
  std::vector<at::Tensor> p = g.params;
  std::vector<at::Tensor> m = g.exp_avgs;
  const std::vector<at::Tensor> grads = o.maximize() ? at::_foreach_neg(g.grads) : g.grads;
  at::_foreach_mul_(p, 1 - o.lr() * o.weight_decay());
  std::vector<at::Tensor> updates = at::_foreach_lerp(m, grads, 1 - beta1);
  at::_foreach_sign_(updates);
  at::_foreach_add_(p, updates, -o.lr());
  at::_foreach_lerp_(m, grads, 1 - beta2);
}

}  // namespace

bool register_lion_optimizer() {
  register_optimizer(OptimizerBinding<Lion>("lion").entry());
  return true;
}

void Lion::update(const at::Tensor& inv_scale) {
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const LionOptions& o = group_options(gi);
    LionGroup g;
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (!p.grad().defined()) {
        continue;
      }
      auto& state =
          state_of(p, [&](LionParamState& s) { s.exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve)); });
      g.params.push_back(p);
      g.grads.push_back(checked_grad(p, gi, i));
      g.exp_avgs.push_back(state.exp_avg());
    }
    if (g.params.empty()) {
      continue;
    }
    std::vector<at::Tensor> all = g.params;
    all.insert(all.end(), g.grads.begin(), g.grads.end());
    all.insert(all.end(), g.exp_avgs.begin(), g.exp_avgs.end());
    if (internal::use_foreach(o.foreach(), o.fused(), all, kName, gi)) {
      if (inv_scale.defined()) {
        g.grads = at::_foreach_mul(g.grads, inv_scale.to(g.grads.front().device()));
      }
      lion_foreach(g, o);
      continue;
    }
    dispatch(
        o.fused(), all, gi,
        [&](auto type) {
          const double grad_mul = (o.maximize() ? -1.0 : 1.0) * detail::cpu_scalar(inv_scale, 1.0);
          lion_fused<decltype(type)>(g, coef_of(o, grad_mul));
        },
        [&] {
          if (inv_scale.defined()) {
            for (auto& grad : g.grads) {
              grad = grad * inv_scale.to(grad.device());
            }
          }
          lion_reference(g, o);
        });
  }
}

}  // namespace trainkit::optim
