#include "trainkit/optim/lamb.h"

#include <array>
#include <cmath>

#include <torch/optim/serialize.h>

#include "optim/detail/common.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

void LambParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void LambParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq);
}

namespace {

constexpr const char* kGroupStepsKey = "trainkit_lamb_group_steps";

struct LambGroup {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
};

template <class T>
void fused_group(const LambGroup& g, const LambOptions& o, const detail::LambCoef<T>& coef, bool adapt) {
  const auto numels = detail::numels_of(g.params);
  const T lr = static_cast<T>(o.lr());
  if (!adapt) {
    detail::for_each_even(numels, [&](const detail::Chunk& c) {
      const auto t = static_cast<size_t>(c.tensor);
      detail::lamb_moments_apply(g.params[t].data_ptr<T>() + c.begin, g.grads[t].data_ptr<T>() + c.begin,
                                 g.exp_avgs[t].data_ptr<T>() + c.begin, g.exp_avg_sqs[t].data_ptr<T>() + c.begin, c.n,
                                 coef, lr);
    });
    return;
  }
  std::vector<T> steps(g.params.size(), lr);
  // Moments and norms, then the trust-ratio-scaled update, block by block so that the second pass
  // re-reads m, v and p from cache.
  detail::two_phase_blocks<2>(
      numels,
      [&](const detail::Chunk& c, std::array<double, 2>& sums) {
        const auto t = static_cast<size_t>(c.tensor);
        detail::lamb_moments(g.params[t].data_ptr<T>() + c.begin, g.grads[t].data_ptr<T>() + c.begin,
                             g.exp_avgs[t].data_ptr<T>() + c.begin, g.exp_avg_sqs[t].data_ptr<T>() + c.begin, c.n,
                             coef, sums[0], sums[1]);
      },
      [&](size_t t, const std::array<double, 2>& sums) {
        const double w_norm = std::sqrt(sums[0]);
        const double u_norm = std::sqrt(sums[1]);
        double ratio = (w_norm > 0 && u_norm > 0) ? w_norm / u_norm : 1.0;
        if (o.trust_clip()) {
          ratio = std::min(ratio, 1.0);
        }
        steps[t] = static_cast<T>(o.lr() * ratio);
      },
      [&](const detail::Chunk& c) {
        const auto t = static_cast<size_t>(c.tensor);
        detail::lamb_apply(g.params[t].data_ptr<T>() + c.begin, g.exp_avgs[t].data_ptr<T>() + c.begin,
                           g.exp_avg_sqs[t].data_ptr<T>() + c.begin, c.n, coef, steps[t]);
      });
}

/// timm's LAMB trust ratio from norms (0-dim, or stacked: elementwise), on their device (no host read).
at::Tensor trust_ratio(const at::Tensor& w_norm, const at::Tensor& u_norm, const LambOptions& o) {
  const at::Tensor one = at::ones_like(w_norm);
  const at::Tensor ratio = at::where(w_norm > 0, at::where(u_norm > 0, w_norm / u_norm, one), one);
  return o.trust_clip() ? at::clamp_max(ratio, 1.0) : ratio;
}

/// timm's _single_tensor_lamb, op for op, with no host sync.
void reference_group(const LambGroup& g, const LambOptions& o, const detail::LambCoef<double>& c,
                     const at::Tensor& grad_div, bool adapt) {
  for (size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor p = g.params[i];
    at::Tensor grad = grad_div.defined() ? g.grads[i] / grad_div.to(g.grads[i].device()) : g.grads[i];
    at::Tensor m = g.exp_avgs[i];
    at::Tensor v = g.exp_avg_sqs[i];
    if (c.lerp) {
      m.lerp_(grad, c.beta3);
    } else {
      m.mul_(c.beta1).add_(grad, c.beta3);
    }
    v.mul_(c.beta2).addcmul_(grad, grad, c.one_minus_beta2);
    const at::Tensor denom = (v.sqrt() * c.inv_bc2_sqrt).add_(c.eps);
    at::Tensor update = (m * c.inv_bc1).div_(denom);
    if (o.weight_decay() != 0) {
      update.add_(p, o.weight_decay());
    }
    if (adapt) {
      update.mul_(trust_ratio(p.norm(2), update.norm(2), o));
    }
    p.add_(update, -o.lr());
  }
}

/// reference_group with multi-tensor ops (`_foreach_*`, the norms by `_foreach_norm`): the same ops in the
/// same order over the whole group, no host read.
void foreach_group(const LambGroup& g, const LambOptions& o, const detail::LambCoef<double>& c,
                   const at::Tensor& grad_div, bool adapt) {
  std::vector<at::Tensor> p = g.params;
  std::vector<at::Tensor> grads = g.grads;
  std::vector<at::Tensor> m = g.exp_avgs;
  std::vector<at::Tensor> v = g.exp_avg_sqs;
  if (grad_div.defined()) {
    grads = at::_foreach_div(grads, grad_div.to(grads.front().device()));
  }
  if (c.lerp) {
    at::_foreach_lerp_(m, grads, c.beta3);
  } else {
    at::_foreach_mul_(m, c.beta1);
    at::_foreach_add_(m, grads, c.beta3);
  }
  at::_foreach_mul_(v, c.beta2);
  at::_foreach_addcmul_(v, grads, grads, c.one_minus_beta2);
  std::vector<at::Tensor> denom = at::_foreach_sqrt(v);
  at::_foreach_mul_(denom, c.inv_bc2_sqrt);
  at::_foreach_add_(denom, c.eps);
  std::vector<at::Tensor> update = at::_foreach_mul(m, c.inv_bc1);
  at::_foreach_div_(update, denom);
  if (o.weight_decay() != 0) {
    at::_foreach_add_(update, p, o.weight_decay());
  }
  if (adapt) {
    at::_foreach_mul_(update, detail::trust_ratios(at::_foreach_norm(p, 2), at::_foreach_norm(update, 2),
                                                   [&](const at::Tensor& w, const at::Tensor& u) {
                                                     return trust_ratio(w, u, o);
                                                   }));
  }
  at::_foreach_add_(p, update, -o.lr());
}

}  // namespace

bool register_lamb_optimizer() {
  register_optimizer(OptimizerBinding<Lamb>("lamb").entry());
  return true;
}

void Lamb::update(const at::Tensor& inv_scale) {
  const auto& defaults = static_cast<const LambOptions&>(*defaults_);
  group_steps_.resize(param_groups_.size(), 0);

  // Global gradient clip over every group (timm: max_grad_norm of the defaults), as a divisor >= 1; the
  // norm is the one gradient clipping computes (fused on the CPU), of the unscaled gradients when a
  // GradScaler scale is given.
  std::vector<at::Tensor> grads;
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad().defined()) {
        grads.push_back(checked_grad(params[i], gi, i));
      }
    }
  }
  const double inv = detail::cpu_scalar(inv_scale, 1.0);
  at::Tensor clip;  // 0-dim; undefined = no clipping
  const double max_grad_norm = defaults.max_grad_norm().value_or(0.0);
  if (max_grad_norm > 0 && !grads.empty()) {
    at::Tensor norm = detail::total_norm(grads, 2.0);
    if (inv_scale.defined()) {
      norm = norm * inv_scale.abs().to(norm.device());
    }
    clip = at::clamp_min(norm / max_grad_norm, 1.0);
  }

  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const LambOptions& o = group_options(gi);
    const int64_t step = ++group_steps_[gi];
    LambGroup g;
    for (const auto& p : param_groups_[gi].params()) {
      if (!p.grad().defined()) {
        continue;
      }
      auto& state = state_of(p, [&](LambParamState& s) {
        s.exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        s.exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      });
      g.params.push_back(p);
      g.grads.push_back(p.grad());
      g.exp_avgs.push_back(state.exp_avg());
      g.exp_avg_sqs.push_back(state.exp_avg_sq());
    }
    if (g.params.empty()) {
      continue;
    }
    const double beta1 = std::get<0>(o.betas());
    const double beta2 = std::get<1>(o.betas());
    const double beta3 = o.grad_averaging() ? 1 - beta1 : 1.0;
    const double bc1 = o.bias_correction() ? 1 - std::pow(beta1, static_cast<double>(step)) : 1.0;
    const double bc2 = o.bias_correction() ? 1 - std::pow(beta2, static_cast<double>(step)) : 1.0;
    const bool adapt = o.weight_decay() != 0 || o.always_adapt();
    detail::LambCoef<double> coef{};
    coef.grad_mul = 1.0;
    coef.beta1 = beta1;
    coef.beta3 = beta3;
    coef.beta2 = beta2;
    coef.one_minus_beta2 = 1 - beta2;
    coef.inv_bc1 = 1 / bc1;
    coef.inv_bc2_sqrt = 1 / std::sqrt(bc2);
    coef.eps = o.eps();
    coef.wd = o.weight_decay();
    coef.lerp = beta3 == 1 - beta1;
    std::vector<at::Tensor> all = g.params;
    all.insert(all.end(), g.grads.begin(), g.grads.end());
    all.insert(all.end(), g.exp_avgs.begin(), g.exp_avgs.end());
    all.insert(all.end(), g.exp_avg_sqs.begin(), g.exp_avg_sqs.end());
    if (internal::use_foreach(o.foreach(), o.fused(), all, kName, gi)) {
      if (inv_scale.defined()) {
        g.grads = at::_foreach_mul(g.grads, inv_scale.to(g.grads.front().device()));
      }
      foreach_group(g, o, coef, clip, adapt);
      continue;
    }
    dispatch(
        o.fused(), all, gi,
        [&](auto type) {
          using T = decltype(type);
          coef.grad_mul = inv / detail::cpu_scalar(clip, 1.0);
          fused_group<T>(g, o, coef.cast<T>(), adapt);
        },
        [&] {
          if (inv_scale.defined()) {
            for (auto& grad : g.grads) {
              grad = grad * inv_scale.to(grad.device());
            }
          }
          reference_group(g, o, coef, clip, adapt);
        });
  }
}

void Lamb::save_extra(torch::serialize::OutputArchive& archive) const {
  archive.write(kGroupStepsKey, torch::tensor(group_steps_, at::kLong));
}

void Lamb::load_extra(torch::serialize::InputArchive& archive) {
  group_steps_.clear();
  at::Tensor t;
  if (archive.try_read(kGroupStepsKey, t)) {
    t = t.to(at::kLong).contiguous();
    group_steps_.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
}

}  // namespace trainkit::optim
