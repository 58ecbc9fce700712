#include "trainkit/optim/nadam.h"

#include <cmath>

#include <torch/optim/serialize.h>

#include "optim/detail/moment_update.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

void NAdamParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(mu_product);
}

void NAdamParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, mu_product);
}

namespace {

/// μt = β1·(1 - ½·0.96^(t·ψ)) of step t, as torch.optim.NAdam computes it in Python floats.
double mu_of(const NAdamOptions& o, double t) {
  return std::get<0>(o.betas()) * (1.0 - 0.5 * std::pow(0.96, t * o.momentum_decay()));
}

/// The step sizes of step `step` once the mu product is `mu_product` (Πt): -lr·(1-μt)/(1-Πt) for the gradient
/// and -lr·μ(t+1)/(1-Πt·μ(t+1)) for the first moment.
struct StepSizes {
  double grad, avg;
};
StepSizes step_sizes(const NAdamOptions& o, int64_t step, double mu_product) {
  const auto t = static_cast<double>(step);
  const double mu = mu_of(o, t);
  const double mu_next = mu_of(o, t + 1);
  return {-o.lr() * (1.0 - mu) / (1.0 - mu_product), (-o.lr() * mu_next) / (1.0 - mu_product * mu_next)};
}

double bias_correction2(const NAdamOptions& o, int64_t step) {
  return 1 - std::pow(std::get<1>(o.betas()), static_cast<double>(step));
}

/// mu_product ← mu_product·μ in the tensor's dtype, as ATen's mul_ by a number rounds it; returns the product.
double mul_mu_product(const at::Tensor& mu_product, double mu) {
  if (mu_product.scalar_type() == at::kFloat) {
    float* x = mu_product.data_ptr<float>();
    *x = *x * static_cast<float>(mu);
    return *x;
  }
  double* x = mu_product.data_ptr<double>();
  *x = *x * mu;
  return *x;
}

/// The fused step of one group of float32/float64 (T) tensors.
template <class T>
void fused_group(const detail::MomentGroup& g, const NAdamOptions& o, double grad_mul) {
  const auto [beta1, beta2] = o.betas();
  std::vector<detail::NAdamCoef<T>> coefs;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const int64_t step = g.steps[i];
    const double mu_product = mul_mu_product(g.mu_products[i], mu_of(o, static_cast<double>(step)));
    const StepSizes s = step_sizes(o, step, mu_product);
    detail::NAdamCoef<T> c{};
    c.moments = detail::moment_coef<T>(grad_mul, o.weight_decay(), o.decoupled_weight_decay(), o.lr(), beta1, beta2,
                                       o.eps());
    c.bc2 = static_cast<T>(bias_correction2(o, step));
    c.grad_step = static_cast<T>(s.grad);
    c.avg_step = static_cast<T>(s.avg);
    coefs.push_back(c);
  }
  detail::run_moment_kernel<T>(g, coefs, [](auto... args) { detail::nadam_kernel(args...); });
}

/// PyTorch's single-tensor NAdam, op for op (any device and dtype).
void reference_group(const detail::MomentGroup& g, const NAdamOptions& o, const at::Tensor& inv_scale) {
  const double beta1 = std::get<0>(o.betas());
  const double beta2 = std::get<1>(o.betas());
  detail::for_each_reference(g, o, o.decoupled_weight_decay(), inv_scale,
                             [&](size_t i, at::Tensor& p, const at::Tensor& grad, at::Tensor& m, at::Tensor& v) {
                               at::Tensor mu_product = g.mu_products[i];
                               mu_product.mul_(mu_of(o, static_cast<double>(g.steps[i])));
                               detail::update_moments(m, v, grad, beta1, beta2);
                               at::Tensor denom = v.div(bias_correction2(o, g.steps[i])).sqrt();
                               denom.add_(o.eps());
                               const StepSizes s = step_sizes(o, g.steps[i], mu_product.item<double>());
                               p.addcdiv_(grad, denom, s.grad);
                               p.addcdiv_(m, denom, s.avg);
                             });
}

/// reference_group with multi-tensor ops: the same ops in the same order, each over the whole group. The mu
/// products stay on the CPU (as PyTorch keeps them), so reading them costs no device synchronization.
void foreach_group(detail::MomentGroup& g, const NAdamOptions& o, const at::Tensor& inv_scale) {
  const auto [beta1, beta2] = o.betas();
  const size_t n = g.params.size();
  const auto grads = detail::foreach_grads(g.params, g.grads, inv_scale, o.maximize(), o.weight_decay(),
                                           o.decoupled_weight_decay(), o.lr());
  at::_foreach_mul_(g.mu_products,
                    detail::scalar_list(n, [&](size_t i) { return mu_of(o, static_cast<double>(g.steps[i])); }));
  detail::foreach_update_moments(g, grads, beta1, beta2);
  std::vector<at::Tensor> denom =
      at::_foreach_div(g.seconds, detail::scalar_list(n, [&](size_t i) { return bias_correction2(o, g.steps[i]); }));
  at::_foreach_sqrt_(denom);
  at::_foreach_add_(denom, o.eps());
  std::vector<StepSizes> s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(step_sizes(o, g.steps[i], g.mu_products[i].item<double>()));
  }
  at::_foreach_addcdiv_(g.params, grads, denom, detail::scalar_list(n, [&](size_t i) { return s[i].grad; }));
  at::_foreach_addcdiv_(g.params, g.exp_avgs, denom, detail::scalar_list(n, [&](size_t i) { return s[i].avg; }));
}

}  // namespace

bool register_nadam_optimizer() {
  register_optimizer(OptimizerBinding<NAdam>("nadam").entry());
  return true;
}

void NAdam::update(const at::Tensor& inv_scale) {
  detail::moment_update<NAdamParamState>(
      *this,
      [](NAdamParamState& s, const at::Tensor& p) {
        s.exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        s.exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        // PyTorch's _get_scalar_dtype(): float64 when the default dtype is float64, else float32.
        const auto dtype = at::get_default_dtype_as_scalartype() == at::kDouble ? at::kDouble : at::kFloat;
        s.mu_product(at::ones({}, at::dtype(dtype)));
      },
      [](NAdamParamState& s, detail::MomentGroup& g) {
        g.exp_avgs.push_back(s.exp_avg());
        g.seconds.push_back(s.exp_avg_sq());
        g.mu_products.push_back(s.mu_product());
      },
      [&](auto type, const detail::MomentGroup& g, const NAdamOptions& o) {
        fused_group<decltype(type)>(g, o, (o.maximize() ? -1.0 : 1.0) * detail::cpu_scalar(inv_scale, 1.0));
      },
      [&](const detail::MomentGroup& g, const NAdamOptions& o) { reference_group(g, o, inv_scale); },
      [&](detail::MomentGroup& g, const NAdamOptions& o) { foreach_group(g, o, inv_scale); });
}

}  // namespace trainkit::optim
