#include "trainkit/optim/radam.h"

#include <cmath>

#include <torch/optim/serialize.h>

#include "optim/detail/moment_update.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

void RAdamParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void RAdamParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq);
}

namespace {

/// The scalars of step `step`, computed as torch.optim.RAdam does in Python floats.
struct Rectification {
  double bc1, bc2_sqrt, rect;
  bool rectified;  ///< ρt > 5: the variance of the adaptive learning rate is tractable
};

Rectification rectification(const RAdamOptions& o, int64_t step) {
  const auto [beta1, beta2] = o.betas();
  const auto t = static_cast<double>(step);
  const double bc2 = 1 - std::pow(beta2, t);
  const double rho_inf = 2 / (1 - beta2) - 1;
  const double rho_t = rho_inf - 2 * t * std::pow(beta2, t) / bc2;
  Rectification r{};
  r.bc1 = 1 - std::pow(beta1, t);
  r.bc2_sqrt = std::pow(bc2, 0.5);
  r.rectified = rho_t > 5.0;
  r.rect = r.rectified ? std::pow((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t), 0.5) : 1.0;
  return r;
}

/// The fused step of one group of float32/float64 (T) tensors.
template <class T>
void fused_group(const detail::MomentGroup& g, const RAdamOptions& o, double grad_mul) {
  const auto [beta1, beta2] = o.betas();
  std::vector<detail::RAdamCoef<T>> coefs;
  for (const int64_t step : g.steps) {
    const Rectification r = rectification(o, step);
    detail::RAdamCoef<T> c{};
    c.moments = detail::moment_coef<T>(grad_mul, o.weight_decay(), o.decoupled_weight_decay(), o.lr(), beta1, beta2,
                                       o.eps());
    c.bc1 = static_cast<T>(r.bc1);
    c.lr = static_cast<T>(o.lr());
    c.bc2_sqrt = static_cast<T>(r.bc2_sqrt);
    c.rect = static_cast<T>(r.rect);
    c.rectified = r.rectified;
    coefs.push_back(c);
  }
  detail::run_moment_kernel<T>(g, coefs, [](auto... args) { detail::radam_kernel(args...); });
}

/// PyTorch's single-tensor RAdam, op for op (any device and dtype).
void reference_group(const detail::MomentGroup& g, const RAdamOptions& o, const at::Tensor& inv_scale) {
  const double beta1 = std::get<0>(o.betas());
  const double beta2 = std::get<1>(o.betas());
  detail::for_each_reference(g, o, o.decoupled_weight_decay(), inv_scale,
                             [&](size_t i, at::Tensor& p, const at::Tensor& grad, at::Tensor& m, at::Tensor& v) {
                               detail::update_moments(m, v, grad, beta1, beta2);
                               const Rectification r = rectification(o, g.steps[i]);
                               at::Tensor update = (m / r.bc1) * o.lr();
                               if (r.rectified) {
                                 update = update * (v.sqrt().add_(o.eps()).reciprocal() * r.bc2_sqrt) * r.rect;
                               }
                               p.add_(update, -1.0);
                             });
}

/// reference_group with multi-tensor ops: the same ops in the same order, each over the whole group.
void foreach_group(detail::MomentGroup& g, const RAdamOptions& o, const at::Tensor& inv_scale) {
  const auto [beta1, beta2] = o.betas();
  const size_t n = g.params.size();
  const auto grads = detail::foreach_grads(g.params, g.grads, inv_scale, o.maximize(), o.weight_decay(),
                                           o.decoupled_weight_decay(), o.lr());
  detail::foreach_update_moments(g, grads, beta1, beta2);
  std::vector<Rectification> r;
  for (const int64_t step : g.steps) {
    r.push_back(rectification(o, step));
  }
  std::vector<at::Tensor> updates = at::_foreach_div(g.exp_avgs, detail::scalar_list(n, [&](size_t i) { return r[i].bc1; }));
  at::_foreach_mul_(updates, o.lr());
  std::vector<at::Tensor> rectified, v;
  std::vector<at::Scalar> bc2_sqrt, rect;
  for (size_t i = 0; i < n; ++i) {
    if (r[i].rectified) {
      rectified.push_back(updates[i]);
      v.push_back(g.seconds[i]);
      bc2_sqrt.emplace_back(r[i].bc2_sqrt);
      rect.emplace_back(r[i].rect);
    }
  }
  if (!rectified.empty()) {
    std::vector<at::Tensor> adaptive = at::_foreach_sqrt(v);
    at::_foreach_add_(adaptive, o.eps());
    at::_foreach_reciprocal_(adaptive);
    at::_foreach_mul_(adaptive, bc2_sqrt);
    at::_foreach_mul_(rectified, adaptive);
    at::_foreach_mul_(rectified, rect);
  }
  at::_foreach_add_(g.params, updates, -1.0);
}

}  // namespace

bool register_radam_optimizer() {
  register_optimizer(OptimizerBinding<RAdam>("radam").entry());
  return true;
}

void RAdam::update(const at::Tensor& inv_scale) {
  detail::moment_update<RAdamParamState>(
      *this,
      [](RAdamParamState& s, const at::Tensor& p) {
        s.exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        s.exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      },
      [](RAdamParamState& s, detail::MomentGroup& g) {
        g.exp_avgs.push_back(s.exp_avg());
        g.seconds.push_back(s.exp_avg_sq());
      },
      [&](auto type, const detail::MomentGroup& g, const RAdamOptions& o) {
        fused_group<decltype(type)>(g, o, (o.maximize() ? -1.0 : 1.0) * detail::cpu_scalar(inv_scale, 1.0));
      },
      [&](const detail::MomentGroup& g, const RAdamOptions& o) { reference_group(g, o, inv_scale); },
      [&](detail::MomentGroup& g, const RAdamOptions& o) { foreach_group(g, o, inv_scale); });
}

}  // namespace trainkit::optim
