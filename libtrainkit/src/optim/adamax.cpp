#include "trainkit/optim/adamax.h"

#include <cmath>

#include <torch/optim/serialize.h>

#include "optim/detail/moment_update.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

void AdamaxParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_inf);
}

void AdamaxParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_inf);
}

namespace {

/// -lr/(1 - β1^t), the step size of step `step`.
double neg_step_size(const AdamaxOptions& o, int64_t step) {
  return -(o.lr() / (1 - std::pow(std::get<0>(o.betas()), static_cast<double>(step))));
}

/// The fused step of one group of float32/float64 (T) tensors.
template <class T>
void fused_group(const detail::MomentGroup& g, const AdamaxOptions& o, double grad_mul) {
  const auto [beta1, beta2] = o.betas();
  std::vector<detail::AdamaxCoef<T>> coefs;
  for (const int64_t step : g.steps) {
    detail::AdamaxCoef<T> c{};
    c.moments = detail::moment_coef<T>(grad_mul, o.weight_decay(), false, o.lr(), beta1, beta2, o.eps());
    c.neg_step_size = static_cast<T>(neg_step_size(o, step));
    coefs.push_back(c);
  }
  detail::run_moment_kernel<T>(g, coefs, [](auto... args) { detail::adamax_kernel(args...); });
}

/// PyTorch's single-tensor Adamax, op for op (any device and dtype).
void reference_group(const detail::MomentGroup& g, const AdamaxOptions& o, const at::Tensor& inv_scale) {
  const double beta1 = std::get<0>(o.betas());
  const double beta2 = std::get<1>(o.betas());
  detail::for_each_reference(g, o, /*decoupled=*/false, inv_scale,
                             [&](size_t i, at::Tensor& p, const at::Tensor& grad, at::Tensor& m, at::Tensor& u) {
                               m.lerp_(grad, 1 - beta1);
                               at::maximum_out(u, u.mul_(beta2), grad.abs().add_(o.eps()));
                               p.addcdiv_(m, u, neg_step_size(o, g.steps[i]));
                             });
}

/// reference_group with multi-tensor ops: the same ops in the same order, each over the whole group.
void foreach_group(detail::MomentGroup& g, const AdamaxOptions& o, const at::Tensor& inv_scale) {
  const auto [beta1, beta2] = o.betas();
  const auto grads =
      detail::foreach_grads(g.params, g.grads, inv_scale, o.maximize(), o.weight_decay(), false, o.lr());
  at::_foreach_lerp_(g.exp_avgs, grads, 1 - beta1);
  at::_foreach_mul_(g.seconds, beta2);
  std::vector<at::Tensor> norm = at::_foreach_abs(grads);
  at::_foreach_add_(norm, o.eps());
  at::_foreach_maximum_(g.seconds, norm);
  at::_foreach_addcdiv_(g.params, g.exp_avgs, g.seconds,
                        detail::scalar_list(g.params.size(), [&](size_t i) { return neg_step_size(o, g.steps[i]); }));
}

}  // namespace

bool register_adamax_optimizer() {
  register_optimizer(OptimizerBinding<Adamax>("adamax").entry());
  return true;
}

void Adamax::update(const at::Tensor& inv_scale) {
  detail::moment_update<AdamaxParamState>(
      *this,
      [](AdamaxParamState& s, const at::Tensor& p) {
        s.exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        s.exp_inf(at::zeros_like(p, at::MemoryFormat::Preserve));
      },
      [](AdamaxParamState& s, detail::MomentGroup& g) {
        g.exp_avgs.push_back(s.exp_avg());
        g.seconds.push_back(s.exp_inf());
      },
      [&](auto type, const detail::MomentGroup& g, const AdamaxOptions& o) {
        fused_group<decltype(type)>(g, o, (o.maximize() ? -1.0 : 1.0) * detail::cpu_scalar(inv_scale, 1.0));
      },
      [&](const detail::MomentGroup& g, const AdamaxOptions& o) { reference_group(g, o, inv_scale); },
      [&](detail::MomentGroup& g, const AdamaxOptions& o) { foreach_group(g, o, inv_scale); });
}

}  // namespace trainkit::optim
