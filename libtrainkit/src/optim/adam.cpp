#include "trainkit/optim/adam.h"

#include <cmath>
#include <type_traits>

#include <torch/optim/serialize.h>

#include "optim/detail/common.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

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

struct AdamGroup {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<int64_t> steps;
  std::vector<AdamParamState*> states;
};

/// The fused step of one group whose parameters have element type P (float, double, c10::BFloat16, c10::Half).
template <class P, class Options>
void fused_group(const AdamGroup& g, const Options& o, double grad_mul) {
  using T = typename detail::KernelTypes<P>::math;
  const auto [beta1, beta2] = o.betas();
  constexpr bool decoupled = Options::kDecoupled;
  std::vector<detail::AdamCoef<T>> coefs;
  coefs.reserve(g.params.size());
  for (const int64_t step : g.steps) {
    const double bc1 = 1 - std::pow(beta1, static_cast<double>(step));
    const double bc2 = 1 - std::pow(beta2, static_cast<double>(step));
    const double w = 1 - beta1;
    detail::AdamCoef<T> c{};
    c.grad_mul = static_cast<T>(grad_mul);
    c.l2 = static_cast<T>(decoupled ? 0.0 : o.weight_decay());
    c.decay = static_cast<T>(decoupled ? 1 - o.lr() * o.weight_decay() : 1.0);
    c.lerp_from_m = std::abs(w) < 0.5;
    c.lerp_weight = static_cast<T>(c.lerp_from_m ? w : w - 1);
    c.beta2 = static_cast<T>(beta2);
    c.one_minus_beta2 = static_cast<T>(1 - beta2);
    c.eps = static_cast<T>(o.eps());
    c.bc2_sqrt = static_cast<T>(std::sqrt(bc2));
    c.neg_step_size = static_cast<T>(-o.lr() / bc1);
    coefs.push_back(c);
  }
  if constexpr (!std::is_same_v<P, T>) {
    if (g.exp_avgs.front().scalar_type() != at::kFloat) {  // state in the parameters' dtype, as torch.optim keeps it
      detail::for_each_even(detail::numels_of(g.params), [&](const detail::Chunk& c) {
        const auto t = static_cast<size_t>(c.tensor);
        auto* vmax = o.amsgrad() ? detail::kernel_data<P>(g.max_exp_avg_sqs[t], c.begin) : nullptr;
        detail::adam_kernel(detail::kernel_data<P>(g.params[t], c.begin), detail::kernel_data<P>(g.grads[t], c.begin),
                            detail::kernel_data<P>(g.exp_avgs[t], c.begin),
                            detail::kernel_data<P>(g.exp_avg_sqs[t], c.begin), vmax, c.n, coefs[t]);
      });
      return;
    }
  }
  detail::for_each_even(detail::numels_of(g.params), [&](const detail::Chunk& c) {
    const auto t = static_cast<size_t>(c.tensor);
    T* vmax = o.amsgrad() ? g.max_exp_avg_sqs[t].data_ptr<T>() + c.begin : nullptr;
    detail::adam_kernel(detail::kernel_data<P>(g.params[t], c.begin), detail::kernel_data<P>(g.grads[t], c.begin),
                        g.exp_avgs[t].data_ptr<T>() + c.begin, g.exp_avg_sqs[t].data_ptr<T>() + c.begin, vmax, c.n,
                        coefs[t]);
  });
}

/// PyTorch's single-tensor Adam, op for op; bfloat16/float16 parameters (and state, where it is kept in
/// their dtype) computed in float32 and rounded once at the end, as the fused kernels do. Any device.
template <class Options>
void reference_group(const AdamGroup& g, const Options& o, const at::Tensor& inv_scale) {
  const auto [beta1, beta2] = o.betas();
  for (size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor param = g.params[i];
    const auto work = internal::state_dtype(param.scalar_type());
    at::Tensor p = detail::in_dtype(param, work);
    at::Tensor grad = detail::in_dtype(g.grads[i], work);
    if (inv_scale.defined()) {
      grad = grad * inv_scale.to(grad.device());
    }
    if (o.maximize()) {
      grad = -grad;
    }
    if (!Options::kDecoupled && o.weight_decay() != 0) {
      grad = grad.add(p, o.weight_decay());
    }
    if (Options::kDecoupled) {
      p.mul_(1 - o.lr() * o.weight_decay());
    }
    const double bc1 = 1 - std::pow(beta1, static_cast<double>(g.steps[i]));
    const double bc2_sqrt = std::sqrt(1 - std::pow(beta2, static_cast<double>(g.steps[i])));
    at::Tensor m_state = g.exp_avgs[i];
    at::Tensor v_state = g.exp_avg_sqs[i];
    at::Tensor m = detail::in_dtype(m_state, work);
    at::Tensor v = detail::in_dtype(v_state, work);
    m.lerp_(grad, 1 - beta1);
    v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    at::Tensor denom;
    if (o.amsgrad()) {
      at::Tensor vmax_state = g.max_exp_avg_sqs[i];
      at::Tensor vmax = detail::in_dtype(vmax_state, work);
      at::maximum_out(vmax, vmax, v);
      denom = (vmax.sqrt() / bc2_sqrt).add_(o.eps());
      detail::write_back(vmax_state, vmax);
    } else {
      denom = (v.sqrt() / bc2_sqrt).add_(o.eps());
    }
    p.addcdiv_(m, denom, -o.lr() / bc1);
    detail::write_back(param, p);
    detail::write_back(m_state, m);
    detail::write_back(v_state, v);
  }
}

/// reference_group with multi-tensor ops: the same ops in the same order, each over the whole group
/// (`_foreach_*`), so that on the CPU it equals the reference path and on CUDA a group takes a few kernel
/// launches instead of about ten per tensor. No host reads.
template <class Options>
void foreach_group(const AdamGroup& g, const Options& o, const at::Tensor& inv_scale) {
  const auto [beta1, beta2] = o.betas();
  const size_t n = g.params.size();
  std::vector<at::Tensor> p(n), grads(n), m(n), v(n), vmax;
  std::vector<at::Scalar> bc2_sqrt(n), step_size(n);
  for (size_t i = 0; i < n; ++i) {
    const auto work = internal::state_dtype(g.params[i].scalar_type());
    p[i] = detail::in_dtype(g.params[i], work);
    grads[i] = detail::in_dtype(g.grads[i], work);
    m[i] = detail::in_dtype(g.exp_avgs[i], work);
    v[i] = detail::in_dtype(g.exp_avg_sqs[i], work);
    if (o.amsgrad()) {
      vmax.push_back(detail::in_dtype(g.max_exp_avg_sqs[i], work));
    }
    const double bc1 = 1 - std::pow(beta1, static_cast<double>(g.steps[i]));
    bc2_sqrt[i] = std::sqrt(1 - std::pow(beta2, static_cast<double>(g.steps[i])));
    step_size[i] = -o.lr() / bc1;
  }
  if (inv_scale.defined()) {
    grads = at::_foreach_mul(grads, inv_scale.to(grads.front().device()));
  }
  if (o.maximize()) {
    grads = at::_foreach_neg(grads);
  }
  if (!Options::kDecoupled && o.weight_decay() != 0) {
    grads = at::_foreach_add(grads, p, o.weight_decay());
  }
  if (Options::kDecoupled) {
    at::_foreach_mul_(p, 1 - o.lr() * o.weight_decay());
  }
  at::_foreach_lerp_(m, grads, 1 - beta1);
  at::_foreach_mul_(v, beta2);
  at::_foreach_addcmul_(v, grads, grads, 1 - beta2);
  std::vector<at::Tensor> denom;
  if (o.amsgrad()) {
    at::_foreach_maximum_(vmax, v);
    denom = at::_foreach_sqrt(vmax);
  } else {
    denom = at::_foreach_sqrt(v);
  }
  at::_foreach_div_(denom, bc2_sqrt);
  at::_foreach_add_(denom, o.eps());
  at::_foreach_addcdiv_(p, m, denom, step_size);
  for (size_t i = 0; i < n; ++i) {
    at::Tensor param = g.params[i];
    at::Tensor m_state = g.exp_avgs[i];
    at::Tensor v_state = g.exp_avg_sqs[i];
    detail::write_back(param, p[i]);
    detail::write_back(m_state, m[i]);
    detail::write_back(v_state, v[i]);
    if (o.amsgrad()) {
      at::Tensor vmax_state = g.max_exp_avg_sqs[i];
      detail::write_back(vmax_state, vmax[i]);
    }
  }
}

/// ATen's `_fused_adam_` / `_fused_adamw_` on one group. The step counts live on the device
/// (AdamParamState::device_step): the kernel skips on `found_inf` there, and the counts are set back with it.
template <class Options>
void aten_fused_group(const AdamGroup& g, const Options& o, const detail::StepScaling& scaling) {
  const auto [beta1, beta2] = o.betas();
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
  if constexpr (Options::kDecoupled) {
    at::_fused_adamw_(g.params, grads, g.exp_avgs, g.exp_avg_sqs, g.max_exp_avg_sqs, steps, o.lr(), beta1, beta2,
                      o.weight_decay(), o.eps(), o.amsgrad(), o.maximize(), grad_scale, found_inf);
  } else {
    at::_fused_adam_(g.params, grads, g.exp_avgs, g.exp_avg_sqs, g.max_exp_avg_sqs, steps, o.lr(), beta1, beta2,
                     o.weight_decay(), o.eps(), o.amsgrad(), o.maximize(), grad_scale, found_inf);
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
void adam_update(Opt& opt, const detail::StepScaling& scaling) {
  const at::Tensor& inv_scale = scaling.inv_scale;
  using Options = typename Opt::options_type;
  auto& groups = opt.param_groups();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Options& o = static_cast<const Options&>(groups[gi].options());
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
      if (o.amsgrad() && !state.max_exp_avg_sq().defined()) {
        state.max_exp_avg_sq(at::zeros_like(state.exp_avg(), at::MemoryFormat::Preserve));
      }
      g.params.push_back(p);
      g.grads.push_back(grad);
      g.exp_avgs.push_back(state.exp_avg());
      g.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (o.amsgrad()) {
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
    if (internal::use_aten_fused(o.aten_fused(), o.fused(), o.foreach(), g.params, Opt::kName, gi)) {
      values.insert(values.end(), state.begin(), state.end());
      internal::check_aten_fusable(values, Opt::kName, gi);
      aten_fused_group(g, o, scaling);
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
    if (internal::use_foreach(o.foreach(), o.fused(), values, Opt::kName, gi)) {
      foreach_group(g, o, inv_scale);
      continue;
    }
    dispatch_fused(
        o.fused(), values, state, /*reduced_ok=*/true, Opt::kName, gi,
        [&](auto type) {
          const double grad_mul = (o.maximize() ? -1.0 : 1.0) * detail::cpu_scalar(inv_scale, 1.0);
          fused_group<decltype(type)>(g, o, grad_mul);
        },
        [&] { reference_group(g, o, inv_scale); }, /*reduced_state_ok=*/true);
  }
}

}  // namespace

bool register_adam_optimizers() {
  register_optimizer(OptimizerBinding<Adam>("adam").entry());
  register_optimizer(OptimizerBinding<AdamW>("adamw").entry());
  return true;
}

template <class Self, class Options>
void AdamFamily<Self, Options>::update(const at::Tensor& inv_scale) {
  adam_update(static_cast<Self&>(*this), {inv_scale, {}, {}});
}

template <class Self, class Options>
void AdamFamily<Self, Options>::update_found_inf(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  adam_update(static_cast<Self&>(*this), {{}, grad_scale, found_inf});
}

template <class Self, class Options>
bool AdamFamily<Self, Options>::takes_found_inf() const {
  return this->all_groups_aten_fused();
}

template class AdamFamily<Adam, AdamOptions>;
template class AdamFamily<AdamW, AdamWOptions>;

}  // namespace trainkit::optim
