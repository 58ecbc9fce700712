#include "trainkit/optim/adam.h"

#include <cmath>

#include <torch/optim/serialize.h>

#include "optim/detail/common.h"

namespace trainkit::optim {

void AdamOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(amsgrad);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(fused);
}

void AdamOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, amsgrad);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, fused);
}

void AdamWOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(amsgrad);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(fused);
}

void AdamWOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, amsgrad);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, fused);
}

void AdamParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_exp_avg_sq);
}

void AdamParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, max_exp_avg_sq);
}

namespace {

/// The hyperparameters of one group, whichever of AdamOptions / AdamWOptions holds them.
struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, maximize, decoupled;
  std::optional<bool> fused;
};

template <class Options>
AdamHyper hyper_of(const Options& o, bool decoupled) {
  return {o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.amsgrad(),
          o.maximize(), decoupled, o.fused()};
}

void validate(const AdamHyper& h, const char* name) {
  detail::check_option(h.lr >= 0, name, "learning rate (lr)", h.lr);
  detail::check_option(h.eps >= 0, name, "epsilon (eps)", h.eps);
  detail::check_option(h.beta1 >= 0 && h.beta1 < 1, name, "beta parameter at index 0 (betas[0], must be in [0, 1))",
                       h.beta1);
  detail::check_option(h.beta2 >= 0 && h.beta2 < 1, name, "beta parameter at index 1 (betas[1], must be in [0, 1))",
                       h.beta2);
  detail::check_option(h.weight_decay >= 0, name, "weight_decay", h.weight_decay);
}

struct AdamGroup {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<int64_t> steps;
};

template <class T>
void fused_group(const AdamGroup& g, const AdamHyper& h, double grad_mul) {
  std::vector<detail::AdamCoef<T>> coefs;
  coefs.reserve(g.params.size());
  for (const int64_t step : g.steps) {
    const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(step));
    const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(step));
    const double w = 1 - h.beta1;
    const bool small = std::abs(w) < 0.5;
    coefs.push_back({static_cast<T>(grad_mul), static_cast<T>(h.decoupled ? 0.0 : h.weight_decay),
                     static_cast<T>(h.decoupled ? 1 - h.lr * h.weight_decay : 1.0), static_cast<T>(small ? w : w - 1),
                     static_cast<T>(h.beta2), static_cast<T>(1 - h.beta2), static_cast<T>(h.eps),
                     static_cast<T>(std::sqrt(bc2)), static_cast<T>(-h.lr / bc1), small});
  }
  const auto chunks = detail::make_chunks(detail::numels_of(g.params));
  detail::for_each_chunk(chunks, [&](const detail::Chunk& c) {
    const auto t = static_cast<size_t>(c.tensor);
    T* vmax = h.amsgrad ? g.max_exp_avg_sqs[t].data_ptr<T>() + c.begin : nullptr;
    detail::adam_kernel(g.params[t].data_ptr<T>() + c.begin, g.grads[t].data_ptr<T>() + c.begin,
                        g.exp_avgs[t].data_ptr<T>() + c.begin, g.exp_avg_sqs[t].data_ptr<T>() + c.begin, vmax, c.n,
                        coefs[t]);
  });
}

/// PyTorch's single-tensor Adam, op for op; any device and floating dtype.
void reference_group(const AdamGroup& g, const AdamHyper& h, const at::Tensor& inv_scale) {
  for (size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor p = g.params[i];
    at::Tensor grad = inv_scale.defined() ? g.grads[i] * inv_scale.to(g.grads[i].device()) : g.grads[i];
    if (h.maximize) {
      grad = -grad;
    }
    if (!h.decoupled && h.weight_decay != 0) {
      grad = grad.add(p, h.weight_decay);
    }
    if (h.decoupled) {
      p.mul_(1 - h.lr * h.weight_decay);
    }
    const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(g.steps[i]));
    const double bc2_sqrt = std::sqrt(1 - std::pow(h.beta2, static_cast<double>(g.steps[i])));
    at::Tensor m = g.exp_avgs[i];
    at::Tensor v = g.exp_avg_sqs[i];
    m.lerp_(grad, 1 - h.beta1);
    v.mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
    at::Tensor denom;
    if (h.amsgrad) {
      at::Tensor vmax = g.max_exp_avg_sqs[i];
      at::maximum_out(vmax, vmax, v);
      denom = (vmax.sqrt() / bc2_sqrt).add_(h.eps);
    } else {
      denom = (v.sqrt() / bc2_sqrt).add_(h.eps);
    }
    p.addcdiv_(m, denom, -h.lr / bc1);
  }
}

template <class Options>
void adam_step(torch::optim::Optimizer& opt, bool decoupled, const char* name, const at::Tensor& inv_scale) {
  at::NoGradGuard no_grad;
  auto& groups = opt.param_groups();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const AdamHyper h = hyper_of(static_cast<const Options&>(groups[gi].options()), decoupled);
    AdamGroup g;
    const auto& params = groups[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (!p.grad().defined()) {
        continue;
      }
      const at::Tensor& grad = detail::checked_grad(p, gi, i, name);
      auto& state = detail::param_state<AdamParamState>(opt, p, [&](AdamParamState& s) {
        s.exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        s.exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      });
      if (h.amsgrad && !state.max_exp_avg_sq().defined()) {
        state.max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      }
      state.step(state.step() + 1);
      g.params.push_back(p);
      g.grads.push_back(grad);
      g.exp_avgs.push_back(state.exp_avg());
      g.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (h.amsgrad) {
        g.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      }
      g.steps.push_back(state.step());
    }
    if (g.params.empty()) {
      continue;
    }
    std::vector<at::Tensor> all = g.params;
    all.insert(all.end(), g.grads.begin(), g.grads.end());
    all.insert(all.end(), g.exp_avgs.begin(), g.exp_avgs.end());
    all.insert(all.end(), g.exp_avg_sqs.begin(), g.exp_avg_sqs.end());
    all.insert(all.end(), g.max_exp_avg_sqs.begin(), g.max_exp_avg_sqs.end());
    if (detail::use_fused(h.fused, all, name, gi)) {
      const double grad_mul = (h.maximize ? -1.0 : 1.0) * detail::cpu_scalar(inv_scale, 1.0);
      if (g.params.front().scalar_type() == at::kFloat) {
        fused_group<float>(g, h, grad_mul);
      } else {
        fused_group<double>(g, h, grad_mul);
      }
    } else {
      reference_group(g, h, inv_scale);
    }
  }
}

template <class Options>
void validate_groups(const torch::optim::Optimizer& opt, bool decoupled, const char* name) {
  for (const auto& group : opt.param_groups()) {
    validate(hyper_of(static_cast<const Options&>(group.options()), decoupled), name);
  }
}

}  // namespace

Adam::Adam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, AdamOptions defaults)
    : Optimizer(param_groups, std::make_unique<AdamOptions>(defaults)) {
  detail::restore_group_options(*this, param_groups);
  detail::check_group_options<AdamOptions>(*this, "Adam", "trainkit::optim::AdamOptions");
  validate(hyper_of(defaults, false), "Adam");
  validate_groups<AdamOptions>(*this, false, "Adam");
}

Adam::Adam(std::vector<at::Tensor> params, AdamOptions defaults)
    : Adam({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

at::Tensor Adam::step(LossClosure closure) {
  at::Tensor loss = detail::run_closure(closure);
  adam_step<AdamOptions>(*this, false, "Adam", {});
  return loss;
}

void Adam::step_scaled(const at::Tensor& inv_scale, const at::Tensor& found_inf) {
  if (detail::cpu_scalar(found_inf, 0.0) == 0.0) {
    adam_step<AdamOptions>(*this, false, "Adam", inv_scale);
  }
}

void Adam::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<AdamParamState, AdamOptions>(archive, *this);
}

void Adam::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<AdamParamState, AdamOptions>(archive, *this);
}

AdamW::AdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, AdamWOptions defaults)
    : Optimizer(param_groups, std::make_unique<AdamWOptions>(defaults)) {
  detail::restore_group_options(*this, param_groups);
  detail::check_group_options<AdamWOptions>(*this, "AdamW", "trainkit::optim::AdamWOptions");
  validate(hyper_of(defaults, true), "AdamW");
  validate_groups<AdamWOptions>(*this, true, "AdamW");
}

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions defaults)
    : AdamW({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

at::Tensor AdamW::step(LossClosure closure) {
  at::Tensor loss = detail::run_closure(closure);
  adam_step<AdamWOptions>(*this, true, "AdamW", {});
  return loss;
}

void AdamW::step_scaled(const at::Tensor& inv_scale, const at::Tensor& found_inf) {
  if (detail::cpu_scalar(found_inf, 0.0) == 0.0) {
    adam_step<AdamWOptions>(*this, true, "AdamW", inv_scale);
  }
}

void AdamW::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<AdamParamState, AdamWOptions>(archive, *this);
}

void AdamW::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<AdamParamState, AdamWOptions>(archive, *this);
}

}  // namespace trainkit::optim
