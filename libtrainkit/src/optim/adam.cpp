#include "trainkit/optim/adam.h"

#include <cmath>
#include <type_traits>

#include <torch/optim/serialize.h>

#include "optim/detail/common.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

void AdamOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(amsgrad);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(fused);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(foreach);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(aten_fused);
}

void AdamOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, amsgrad);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, fused);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, foreach);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, aten_fused);
}

void AdamWOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(amsgrad);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(fused);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(foreach);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(aten_fused);
}

void AdamWOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, amsgrad);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, fused);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, foreach);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, aten_fused);
}

void AdamParamState::serialize(torch::serialize::OutputArchive& archive) const {
  // The count ATen's fused kernels keep on the device, when they step, is the count (see device_step).
  const int64_t count = device_step_.defined() ? static_cast<int64_t>(device_step_.item<double>()) : step_;
  archive.write("step", c10::IValue(count));
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
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool amsgrad = false, maximize = false, decoupled = false;
  std::optional<bool> fused;
  std::optional<bool> foreach;
  std::optional<bool> aten_fused;
};

template <class Options>
AdamHyper hyper_of(const Options& o, bool decoupled) {
  AdamHyper h;
  h.lr = o.lr();
  h.beta1 = std::get<0>(o.betas());
  h.beta2 = std::get<1>(o.betas());
  h.eps = o.eps();
  h.weight_decay = o.weight_decay();
  h.amsgrad = o.amsgrad();
  h.maximize = o.maximize();
  h.decoupled = decoupled;
  h.fused = o.fused();
  h.foreach = o.foreach();
  h.aten_fused = o.aten_fused();
  return h;
}

template <class Options>
void validate_adam(const Options& o, const char* name) {
  const auto [beta1, beta2] = o.betas();
  detail::check_option(o.lr() >= 0, name, "learning rate (lr)", o.lr());
  detail::check_option(o.eps() >= 0, name, "epsilon (eps)", o.eps());
  detail::check_option(beta1 >= 0 && beta1 < 1, name, "beta parameter at index 0 (betas[0], must be in [0, 1))", beta1);
  detail::check_option(beta2 >= 0 && beta2 < 1, name, "beta parameter at index 1 (betas[1], must be in [0, 1))", beta2);
  detail::check_option(o.weight_decay() >= 0, name, "weight_decay", o.weight_decay());
}

struct AdamGroup {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<int64_t> steps;
  std::vector<AdamParamState*> states;
};

/// The fused step of one group whose parameters have element type P (float, double, c10::BFloat16, c10::Half).
template <class P>
void fused_group(const AdamGroup& g, const AdamHyper& h, double grad_mul) {
  using T = typename detail::KernelTypes<P>::math;
  std::vector<detail::AdamCoef<T>> coefs;
  coefs.reserve(g.params.size());
  for (const int64_t step : g.steps) {
    const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(step));
    const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(step));
    const double w = 1 - h.beta1;
    detail::AdamCoef<T> c{};
    c.grad_mul = static_cast<T>(grad_mul);
    c.l2 = static_cast<T>(h.decoupled ? 0.0 : h.weight_decay);
    c.decay = static_cast<T>(h.decoupled ? 1 - h.lr * h.weight_decay : 1.0);
    c.lerp_from_m = std::abs(w) < 0.5;
    c.lerp_weight = static_cast<T>(c.lerp_from_m ? w : w - 1);
    c.beta2 = static_cast<T>(h.beta2);
    c.one_minus_beta2 = static_cast<T>(1 - h.beta2);
    c.eps = static_cast<T>(h.eps);
    c.bc2_sqrt = static_cast<T>(std::sqrt(bc2));
    c.neg_step_size = static_cast<T>(-h.lr / bc1);
    coefs.push_back(c);
  }
  if constexpr (!std::is_same_v<P, T>) {
    if (g.exp_avgs.front().scalar_type() != at::kFloat) {  // state in the parameters' dtype, as torch.optim keeps it
      detail::for_each_even(detail::numels_of(g.params), [&](const detail::Chunk& c) {
        const auto t = static_cast<size_t>(c.tensor);
        auto* vmax = h.amsgrad ? detail::kernel_data<P>(g.max_exp_avg_sqs[t], c.begin) : nullptr;
        detail::adam_kernel(detail::kernel_data<P>(g.params[t], c.begin), detail::kernel_data<P>(g.grads[t], c.begin),
                            detail::kernel_data<P>(g.exp_avgs[t], c.begin),
                            detail::kernel_data<P>(g.exp_avg_sqs[t], c.begin), vmax, c.n, coefs[t]);
      });
      return;
    }
  }
  detail::for_each_even(detail::numels_of(g.params), [&](const detail::Chunk& c) {
    const auto t = static_cast<size_t>(c.tensor);
    T* vmax = h.amsgrad ? g.max_exp_avg_sqs[t].data_ptr<T>() + c.begin : nullptr;
    detail::adam_kernel(detail::kernel_data<P>(g.params[t], c.begin), detail::kernel_data<P>(g.grads[t], c.begin),
                        g.exp_avgs[t].data_ptr<T>() + c.begin, g.exp_avg_sqs[t].data_ptr<T>() + c.begin, vmax, c.n,
                        coefs[t]);
  });
}

/// PyTorch's single-tensor Adam, op for op; bfloat16/float16 parameters (and state, where it is kept in
/// their dtype) computed in float32 and rounded once at the end, as the fused kernels do. Any device.
void reference_group(const AdamGroup& g, const AdamHyper& h, const at::Tensor& inv_scale) {
  for (size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor param = g.params[i];
    const auto work = internal::state_dtype(param.scalar_type());
    at::Tensor p = detail::in_dtype(param, work);
    at::Tensor grad = detail::in_dtype(g.grads[i], work);
    if (inv_scale.defined()) {
      grad = grad * inv_scale.to(grad.device());
    }
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
    at::Tensor m_state = g.exp_avgs[i];
    at::Tensor v_state = g.exp_avg_sqs[i];
    at::Tensor m = detail::in_dtype(m_state, work);
    at::Tensor v = detail::in_dtype(v_state, work);
    m.lerp_(grad, 1 - h.beta1);
    v.mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
    at::Tensor denom;
    if (h.amsgrad) {
      at::Tensor vmax_state = g.max_exp_avg_sqs[i];
      at::Tensor vmax = detail::in_dtype(vmax_state, work);
      at::maximum_out(vmax, vmax, v);
      denom = (vmax.sqrt() / bc2_sqrt).add_(h.eps);
      detail::write_back(vmax_state, vmax);
    } else {
      denom = (v.sqrt() / bc2_sqrt).add_(h.eps);
    }
    p.addcdiv_(m, denom, -h.lr / bc1);
    detail::write_back(param, p);
    detail::write_back(m_state, m);
    detail::write_back(v_state, v);
  }
}

/// reference_group with multi-tensor ops: the same ops in the same order, each over the whole group
/// (`_foreach_*`), so that on the CPU it equals the reference path and on CUDA a group takes a few kernel
/// launches instead of about ten per tensor. No host reads.
void foreach_group(const AdamGroup& g, const AdamHyper& h, const at::Tensor& inv_scale) {
  const size_t n = g.params.size();
  std::vector<at::Tensor> p(n), grads(n), m(n), v(n), vmax;
  std::vector<at::Scalar> bc2_sqrt(n), step_size(n);
  for (size_t i = 0; i < n; ++i) {
    const auto work = internal::state_dtype(g.params[i].scalar_type());
    p[i] = detail::in_dtype(g.params[i], work);
    grads[i] = detail::in_dtype(g.grads[i], work);
    m[i] = detail::in_dtype(g.exp_avgs[i], work);
    v[i] = detail::in_dtype(g.exp_avg_sqs[i], work);
    if (h.amsgrad) {
      vmax.push_back(detail::in_dtype(g.max_exp_avg_sqs[i], work));
    }
    const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(g.steps[i]));
    bc2_sqrt[i] = std::sqrt(1 - std::pow(h.beta2, static_cast<double>(g.steps[i])));
    step_size[i] = -h.lr / bc1;
  }
  if (inv_scale.defined()) {
    grads = at::_foreach_mul(grads, inv_scale.to(grads.front().device()));
  }
  if (h.maximize) {
    grads = at::_foreach_neg(grads);
  }
  if (!h.decoupled && h.weight_decay != 0) {
    grads = at::_foreach_add(grads, p, h.weight_decay);
  }
  if (h.decoupled) {
    at::_foreach_mul_(p, 1 - h.lr * h.weight_decay);
  }
  at::_foreach_lerp_(m, grads, 1 - h.beta1);
  at::_foreach_mul_(v, h.beta2);
  at::_foreach_addcmul_(v, grads, grads, 1 - h.beta2);
  std::vector<at::Tensor> denom;
  if (h.amsgrad) {
    at::_foreach_maximum_(vmax, v);
    denom = at::_foreach_sqrt(vmax);
  } else {
    denom = at::_foreach_sqrt(v);
  }
  at::_foreach_div_(denom, bc2_sqrt);
  at::_foreach_add_(denom, h.eps);
  at::_foreach_addcdiv_(p, m, denom, step_size);
  for (size_t i = 0; i < n; ++i) {
    at::Tensor param = g.params[i];
    at::Tensor m_state = g.exp_avgs[i];
    at::Tensor v_state = g.exp_avg_sqs[i];
    detail::write_back(param, p[i]);
    detail::write_back(m_state, m[i]);
    detail::write_back(v_state, v[i]);
    if (h.amsgrad) {
      at::Tensor vmax_state = g.max_exp_avg_sqs[i];
      detail::write_back(vmax_state, vmax[i]);
    }
  }
}

/// ATen's `_fused_adam_` / `_fused_adamw_` on one group. The step counts live on the device
/// (AdamParamState::device_step): the kernel skips on `found_inf` there, and the counts are set back with it.
void aten_fused_group(const AdamGroup& g, const AdamHyper& h, const detail::StepScaling& scaling) {
  const c10::Device device = g.params.front().device();
  std::vector<at::Tensor> steps;
  for (AdamParamState* state : g.states) {
    if (!state->device_step().defined()) {
      state->device_step(at::full({}, static_cast<double>(state->step()), at::dtype(at::kFloat).device(device)));
    }
    steps.push_back(state->device_step());
  }
  at::_foreach_add_(steps, 1);
  const auto [grads, grad_scale, found_inf] = detail::aten_scaling(g.grads, scaling, device);
  if (h.decoupled) {
    at::_fused_adamw_(g.params, grads, g.exp_avgs, g.exp_avg_sqs, g.max_exp_avg_sqs, steps, h.lr, h.beta1, h.beta2,
                      h.weight_decay, h.eps, h.amsgrad, h.maximize, grad_scale, found_inf);
  } else {
    at::_fused_adam_(g.params, grads, g.exp_avgs, g.exp_avg_sqs, g.max_exp_avg_sqs, steps, h.lr, h.beta1, h.beta2,
                     h.weight_decay, h.eps, h.amsgrad, h.maximize, grad_scale, found_inf);
  }
  if (found_inf.has_value()) {
    at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), *found_inf));
  } else {
    for (AdamParamState* state : g.states) {
      state->step(state->step() + 1);  // the host count follows while nothing can skip
    }
  }
}

/// One step of every group of Adam or AdamW.
template <class Opt>
void adam_update(Opt& opt, bool decoupled, const detail::StepScaling& scaling) {
  const at::Tensor& inv_scale = scaling.inv_scale;
  using Options = typename Opt::options_type;
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
      const at::Tensor& grad = internal::checked_grad(p, gi, i, Opt::kName);
      // bfloat16/float16 parameters keep float32 state (internal::state_dtype).
      const auto state_options = p.options().dtype(internal::state_dtype(p.scalar_type()));
      auto& state = internal::param_state<AdamParamState>(opt, p, [&](AdamParamState& s) {
        s.exp_avg(at::zeros_like(p, state_options, at::MemoryFormat::Preserve));
        s.exp_avg_sq(at::zeros_like(p, state_options, at::MemoryFormat::Preserve));
      });
      if (h.amsgrad && !state.max_exp_avg_sq().defined()) {
        state.max_exp_avg_sq(at::zeros_like(state.exp_avg(), at::MemoryFormat::Preserve));
      }
      g.params.push_back(p);
      g.grads.push_back(grad);
      g.exp_avgs.push_back(state.exp_avg());
      g.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (h.amsgrad) {
        g.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      }
      g.states.push_back(&state);
    }
    if (g.params.empty()) {
      continue;
    }
    std::vector<at::Tensor> values = g.params;
    values.insert(values.end(), g.grads.begin(), g.grads.end());
    std::vector<at::Tensor> state = g.exp_avgs;
    state.insert(state.end(), g.exp_avg_sqs.begin(), g.exp_avg_sqs.end());
    state.insert(state.end(), g.max_exp_avg_sqs.begin(), g.max_exp_avg_sqs.end());
    if (internal::use_aten_fused(h.aten_fused, h.fused, h.foreach, g.params, Opt::kName, gi)) {
      values.insert(values.end(), state.begin(), state.end());
      internal::check_aten_fusable(values, Opt::kName, gi);
      aten_fused_group(g, h, scaling);
      continue;
    }
    detail::check_host_found_inf(scaling, Opt::kName, gi);
    for (AdamParamState* s : g.states) {
      if (s->device_step().defined()) {  // ATen's kernels stepped last: their count is the count
        s->step(static_cast<int64_t>(s->device_step().item<double>()));
        s->device_step(at::Tensor());
      }
      s->step(s->step() + 1);
      g.steps.push_back(s->step());
    }
    if (internal::use_foreach(h.foreach, h.fused, values, Opt::kName, gi)) {
      foreach_group(g, h, inv_scale);
      continue;
    }
    dispatch_fused(
        h.fused, values, state, /*reduced_ok=*/true, Opt::kName, gi,
        [&](auto type) {
          const double grad_mul = (h.maximize ? -1.0 : 1.0) * detail::cpu_scalar(inv_scale, 1.0);
          fused_group<decltype(type)>(g, h, grad_mul);
        },
        [&] { reference_group(g, h, inv_scale); }, /*reduced_state_ok=*/true);
  }
}

}  // namespace

namespace {

template <class Opt>
OptimizerEntry adam_entry(const char* name, const char* weight_decay_doc) {
  return OptimizerBinding<Opt>(name)
      .bind(TRAINKIT_OPTION(lr), positive(), "Learning rate")
      .bind(TRAINKIT_OPTION(betas), unit_interval(), "(beta1, beta2): running-average coefficients of g and g^2")
      .bind(TRAINKIT_OPTION(eps), non_negative(), "Term added to the denominator")
      .bind(TRAINKIT_OPTION(weight_decay), non_negative(), weight_decay_doc)
      .bind(TRAINKIT_OPTION(amsgrad), "AMSGrad: the maximum of past squared-gradient averages")
      .bind(TRAINKIT_OPTION(maximize), "Maximize the objective instead of minimizing it")
      .bind(TRAINKIT_OPTION(fused), detail::kFusedDoc)
      .bind(TRAINKIT_OPTION(foreach), detail::kForeachDoc)
      .bind(TRAINKIT_OPTION(aten_fused), detail::kAtenFusedDoc)
      .entry();
}

}  // namespace

bool register_adam_optimizers() {
  register_optimizer(adam_entry<Adam>("adam", "L2 penalty added to the gradient"));
  register_optimizer(adam_entry<AdamW>("adamw", "Decoupled weight decay: p <- p (1 - lr wd)"));
  return true;
}

void Adam::validate(const AdamOptions& options) { validate_adam(options, kName); }

void Adam::update(const at::Tensor& inv_scale) { adam_update(*this, /*decoupled=*/false, {inv_scale, {}, {}}); }

void Adam::update_found_inf(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  adam_update(*this, /*decoupled=*/false, {{}, grad_scale, found_inf});
}

bool Adam::takes_found_inf() const { return all_groups_aten_fused(); }

void AdamW::validate(const AdamWOptions& options) { validate_adam(options, kName); }

void AdamW::update(const at::Tensor& inv_scale) { adam_update(*this, /*decoupled=*/true, {inv_scale, {}, {}}); }

void AdamW::update_found_inf(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  adam_update(*this, /*decoupled=*/true, {{}, grad_scale, found_inf});
}

bool AdamW::takes_found_inf() const { return all_groups_aten_fused(); }

}  // namespace trainkit::optim
