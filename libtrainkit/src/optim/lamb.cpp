#include "trainkit/optim/lamb.h"

#include <cmath>

#include <torch/optim/serialize.h>

#include "optim/detail/common.h"
#include "trainkit/grad/clip.h"

namespace trainkit::optim {

void LambOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(bias_correction);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(grad_averaging);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_grad_norm);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(trust_clip);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(always_adapt);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(fused);
}

void LambOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, bias_correction);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, grad_averaging);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(double, max_grad_norm);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, trust_clip);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, always_adapt);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, fused);
}

void LambParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void LambParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq);
}

namespace {

constexpr const char* kName = "Lamb";
constexpr const char* kGroupStepsKey = "trainkit_lamb_group_steps";

void validate(const LambOptions& o) {
  detail::check_option(o.lr() >= 0, kName, "learning rate (lr)", o.lr());
  detail::check_option(o.eps() >= 0, kName, "epsilon (eps)", o.eps());
  const double b1 = std::get<0>(o.betas());
  const double b2 = std::get<1>(o.betas());
  detail::check_option(b1 >= 0 && b1 < 1, kName, "beta parameter at index 0 (betas[0], must be in [0, 1))", b1);
  detail::check_option(b2 >= 0 && b2 < 1, kName, "beta parameter at index 1 (betas[1], must be in [0, 1))", b2);
  detail::check_option(o.weight_decay() >= 0, kName, "weight_decay", o.weight_decay());
  if (o.max_grad_norm().has_value()) {
    detail::check_option(*o.max_grad_norm() > 0, kName, "max_grad_norm (must be > 0, or unset)", *o.max_grad_norm());
  }
}

struct LambGroup {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
};

template <class T>
void fused_group(const LambGroup& g, const LambOptions& o, const detail::LambCoef<T>& coef, bool adapt) {
  const auto numels = detail::numels_of(g.params);
  const T lr = static_cast<T>(o.lr());
  if (!adapt) {
    detail::for_each_chunk(detail::make_chunks(numels), [&](const detail::Chunk& c) {
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
  for (const auto& [first, last] : detail::make_blocks(numels)) {
    const auto chunks = detail::make_chunks(numels, first, last);
    std::vector<double> sp(chunks.size(), 0.0);
    std::vector<double> su(chunks.size(), 0.0);
    at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t ci = begin; ci < end; ++ci) {
        const detail::Chunk& c = chunks[static_cast<size_t>(ci)];
        const auto t = static_cast<size_t>(c.tensor);
        detail::lamb_moments(g.params[t].data_ptr<T>() + c.begin, g.grads[t].data_ptr<T>() + c.begin,
                             g.exp_avgs[t].data_ptr<T>() + c.begin, g.exp_avg_sqs[t].data_ptr<T>() + c.begin, c.n,
                             coef, sp[static_cast<size_t>(ci)], su[static_cast<size_t>(ci)]);
      }
    });
    // Per-tensor sums combined in chunk order, so the result does not depend on the thread count.
    std::vector<double> wp(g.params.size(), 0.0);
    std::vector<double> wu(g.params.size(), 0.0);
    for (size_t c = 0; c < chunks.size(); ++c) {
      wp[static_cast<size_t>(chunks[c].tensor)] += sp[c];
      wu[static_cast<size_t>(chunks[c].tensor)] += su[c];
    }
    for (size_t t = first; t < last; ++t) {
      const double w_norm = std::sqrt(wp[t]);
      const double u_norm = std::sqrt(wu[t]);
      double ratio = (w_norm > 0 && u_norm > 0) ? w_norm / u_norm : 1.0;
      if (o.trust_clip()) {
        ratio = std::min(ratio, 1.0);
      }
      steps[t] = static_cast<T>(o.lr() * ratio);
    }
    detail::for_each_chunk(chunks, [&](const detail::Chunk& c) {
      const auto t = static_cast<size_t>(c.tensor);
      detail::lamb_apply(g.params[t].data_ptr<T>() + c.begin, g.exp_avgs[t].data_ptr<T>() + c.begin,
                         g.exp_avg_sqs[t].data_ptr<T>() + c.begin, c.n, coef, steps[t]);
    });
  }
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
      const at::Tensor w_norm = p.norm(2);
      const at::Tensor u_norm = update.norm(2);
      const at::Tensor one = at::ones_like(w_norm);
      at::Tensor ratio = at::where(w_norm > 0, at::where(u_norm > 0, w_norm / u_norm, one), one);
      if (o.trust_clip()) {
        ratio = at::clamp_max(ratio, 1.0);
      }
      update.mul_(ratio);
    }
    p.add_(update, -o.lr());
  }
}

}  // namespace

Lamb::Lamb(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, LambOptions defaults)
    : Optimizer(param_groups, std::make_unique<LambOptions>(defaults)) {
  detail::restore_group_options(*this, param_groups);
  detail::check_group_options<LambOptions>(*this, "Lamb", "trainkit::optim::LambOptions");
  validate(defaults);
  for (const auto& group : param_groups_) {
    validate(static_cast<const LambOptions&>(group.options()));
  }
}

Lamb::Lamb(std::vector<at::Tensor> params, LambOptions defaults)
    : Lamb({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

at::Tensor Lamb::step(LossClosure closure) {
  at::Tensor loss = detail::run_closure(closure);
  step_impl({});
  return loss;
}

void Lamb::step_scaled(const at::Tensor& inv_scale, const at::Tensor& found_inf) {
  if (detail::cpu_scalar(found_inf, 0.0) == 0.0) {
    step_impl(inv_scale);
  }
}

void Lamb::step_impl(const at::Tensor& inv_scale) {
  at::NoGradGuard no_grad;
  const auto& defaults = static_cast<const LambOptions&>(*defaults_);
  group_steps_.resize(param_groups_.size(), 0);

  // Global gradient clip over every group (timm: max_grad_norm of the defaults), as a divisor >= 1; the
  // norm is grad::grad_norm's (fused on the CPU), of the unscaled gradients when a GradScaler scale is given.
  std::vector<at::Tensor> with_grad;
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad().defined()) {
        detail::checked_grad(params[i], gi, i, kName);
        with_grad.push_back(params[i]);
      }
    }
  }
  const double inv = detail::cpu_scalar(inv_scale, 1.0);
  at::Tensor clip;  // 0-dim; undefined = no clipping
  if (defaults.max_grad_norm().has_value() && !with_grad.empty()) {
    at::Tensor norm = grad::grad_norm(with_grad);
    if (inv_scale.defined()) {
      norm = norm * inv_scale.abs().to(norm.device());
    }
    clip = at::clamp_min(norm / *defaults.max_grad_norm(), 1.0);
  }

  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& o = static_cast<const LambOptions&>(param_groups_[gi].options());
    const int64_t step = ++group_steps_[gi];
    LambGroup g;
    const auto& params = param_groups_[gi].params();
    for (const auto& p : params) {
      if (!p.grad().defined()) {
        continue;
      }
      auto& state = detail::param_state<LambParamState>(*this, p, [&](LambParamState& s) {
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
    detail::LambCoef<double> coef{1.0,     beta1,          beta3,
                                  beta2,   1 - beta2,      1 / bc1,
                                  1 / std::sqrt(bc2), o.eps(), o.weight_decay(),
                                  beta3 == 1 - beta1};
    std::vector<at::Tensor> all = g.params;
    all.insert(all.end(), g.grads.begin(), g.grads.end());
    all.insert(all.end(), g.exp_avgs.begin(), g.exp_avgs.end());
    all.insert(all.end(), g.exp_avg_sqs.begin(), g.exp_avg_sqs.end());
    if (detail::use_fused(o.fused(), all, kName, gi)) {
      coef.grad_mul = inv / detail::cpu_scalar(clip, 1.0);
      if (g.params.front().scalar_type() == at::kFloat) {
        const detail::LambCoef<float> c32{static_cast<float>(coef.grad_mul), static_cast<float>(coef.beta1),
                                          static_cast<float>(coef.beta3),    static_cast<float>(coef.beta2),
                                          static_cast<float>(coef.one_minus_beta2), static_cast<float>(coef.inv_bc1),
                                          static_cast<float>(coef.inv_bc2_sqrt), static_cast<float>(coef.eps),
                                          static_cast<float>(coef.wd),       coef.lerp};
        fused_group<float>(g, o, c32, adapt);
      } else {
        fused_group<double>(g, o, coef, adapt);
      }
    } else {
      if (inv_scale.defined()) {
        for (auto& grad : g.grads) {
          grad = grad * inv_scale.to(grad.device());
        }
      }
      reference_group(g, o, coef, clip, adapt);
    }
  }
}

void Lamb::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
  archive.write(kGroupStepsKey, torch::tensor(group_steps_, at::kLong));
}

void Lamb::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
  group_steps_.clear();
  at::Tensor t;
  if (archive.try_read(kGroupStepsKey, t)) {
    t = t.to(at::kLong).contiguous();
    group_steps_.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
}

}  // namespace trainkit::optim
