#pragma once
// What RAdam, NAdam and Adamax share: gathering a param group's tensors and step counts, the choice of path
// (fused CPU kernel, ATen reference, _foreach_*), the gradient as PyTorch's single-tensor implementations
// form it, and the coefficients of Adam's moments for the fused kernels.

#include <cmath>
#include <cstdint>
#include <vector>

#include "optim/detail/common.h"

namespace trainkit::optim::detail {

/// One param group's tensors that have gradients: parameters, gradients, first moments, second moments
/// (exp_avg_sq, or Adamax's exp_inf), NAdam's mu products, and each tensor's step count after this step.
struct MomentGroup {
  std::vector<at::Tensor> params, grads, exp_avgs, seconds, mu_products;
  std::vector<int64_t> steps;
};

/// The gradient of parameter `p` as PyTorch's single-tensor RAdam/NAdam/Adamax form it: × inv_scale (when
/// defined), negated for maximize, + weight_decay·p unless `decoupled`; `decoupled` decays p ← p·(1 - lr·wd).
inline at::Tensor reference_grad(at::Tensor& p, const at::Tensor& grad, const at::Tensor& inv_scale, bool maximize,
                                 double weight_decay, bool decoupled, double lr) {
  at::Tensor g = inv_scale.defined() ? grad * inv_scale.to(grad.device()) : grad;
  if (maximize) {
    g = -g;
  }
  if (weight_decay != 0) {
    if (decoupled) {
      p.mul_(1 - lr * weight_decay);
    } else {
      g = g.add(p, weight_decay);
    }
  }
  return g;
}

/// reference_grad over a group with `_foreach_*` ops.
inline std::vector<at::Tensor> foreach_grads(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                                             const at::Tensor& inv_scale, bool maximize, double weight_decay,
                                             bool decoupled, double lr) {
  std::vector<at::Tensor> g = inv_scale.defined() ? at::_foreach_mul(grads, inv_scale.to(grads.front().device())) : grads;
  if (maximize) {
    g = at::_foreach_neg(g);
  }
  if (weight_decay != 0) {
    if (decoupled) {
      at::_foreach_mul_(params, 1 - lr * weight_decay);
    } else {
      g = at::_foreach_add(g, params, weight_decay);
    }
  }
  return g;
}

/// For each tensor i of the group, `body(i, p, grad, m, second)` with the gradient of reference_grad (the
/// reference paths' loop; `decoupled` for RAdam's and NAdam's decoupled_weight_decay).
template <class Options, class Body>
void for_each_reference(const MomentGroup& g, const Options& o, bool decoupled, const at::Tensor& inv_scale,
                        const Body& body) {
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor p = g.params[i];
    const at::Tensor grad =
        reference_grad(p, g.grads[i], inv_scale, o.maximize(), o.weight_decay(), decoupled, o.lr());
    at::Tensor m = g.exp_avgs[i];
    at::Tensor second = g.seconds[i];
    body(i, p, grad, m, second);
  }
}

/// Adam's moments as PyTorch's single-tensor RAdam/NAdam write them: m ← lerp(m, g, 1-β1), v ← β2·v + (1-β2)·g².
inline void update_moments(at::Tensor& m, at::Tensor& v, const at::Tensor& grad, double beta1, double beta2) {
  m.lerp_(grad, 1 - beta1);
  v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
}

/// update_moments over a group with `_foreach_*` ops.
inline void foreach_update_moments(MomentGroup& g, const std::vector<at::Tensor>& grads, double beta1, double beta2) {
  at::_foreach_lerp_(g.exp_avgs, grads, 1 - beta1);
  at::_foreach_mul_(g.seconds, beta2);
  at::_foreach_addcmul_(g.seconds, grads, grads, 1 - beta2);
}

/// Per-tensor scalars for the `_foreach_*` ops, `f(i)` for tensor i of `n`.
template <class F>
std::vector<at::Scalar> scalar_list(std::size_t n, const F& f) {
  std::vector<at::Scalar> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    out.emplace_back(f(i));
  }
  return out;
}

/// The coefficients of Adam's gradient and moments (kernels.h's MomentCoef) in the kernel's type T: the
/// gradient multiplier ±inv_scale, the L2 term or the decoupled decay, and ATen's lerp for m ← lerp(m, g, 1-β1).
template <class T>
MomentCoef<T> moment_coef(double grad_mul, double weight_decay, bool decoupled, double lr, double beta1, double beta2,
                          double eps) {
  const double w = 1 - beta1;
  MomentCoef<T> c{};
  c.grad_mul = static_cast<T>(grad_mul);
  c.l2 = static_cast<T>(decoupled ? 0.0 : weight_decay);
  c.decay = static_cast<T>(decoupled ? 1 - lr * weight_decay : 1.0);
  c.lerp_from_m = std::abs(w) < 0.5;
  c.lerp_weight = static_cast<T>(c.lerp_from_m ? w : w - 1);
  c.beta2 = static_cast<T>(beta2);
  c.one_minus_beta2 = static_cast<T>(1 - beta2);
  c.eps = static_cast<T>(eps);
  return c;
}

/// Runs `kernel(p, g, m, second, n, coefs[t])` over the group's float32/float64 (T) tensors, split over threads.
template <class T, class Coef, class Kernel>
void run_moment_kernel(const MomentGroup& g, const std::vector<Coef>& coefs, const Kernel& kernel) {
  for_each_even(numels_of(g.params), [&](const Chunk& c) {
    const auto t = static_cast<std::size_t>(c.tensor);
    kernel(g.params[t].data_ptr<T>() + c.begin, g.grads[t].data_ptr<T>() + c.begin,
           g.exp_avgs[t].data_ptr<T>() + c.begin, g.seconds[t].data_ptr<T>() + c.begin, c.n, coefs[t]);
  });
}

/// One step of every param group of `opt` (RAdam, NAdam or Adamax, with state `State`): each parameter with a
/// gradient gets its state (`init(state, p)` on first use) and one more step; `add(state, group)` appends
/// its state tensors; then the group runs `foreach(group, options)`, `fused(T{}, group, options)` (T float or
/// double) or `reference(group, options)`, as the options and tensors choose.
template <class State, class Opt, class Init, class Add, class Fused, class Reference, class Foreach>
void moment_update(Opt& opt, const Init& init, const Add& add, const Fused& fused, const Reference& reference,
                   const Foreach& foreach) {
  using Options = typename Opt::options_type;
  auto& groups = opt.param_groups();
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const Options& o = static_cast<const Options&>(groups[gi].options());
    MomentGroup g;
    const auto& params = groups[gi].params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (!p.grad().defined()) {
        continue;
      }
      const at::Tensor& grad = internal::checked_grad(p, gi, i, Opt::kName);
      auto& state = internal::param_state<State>(opt, p, [&](State& s) { init(s, p); });
      state.step(state.step() + 1);
      g.params.push_back(p);
      g.grads.push_back(grad);
      g.steps.push_back(state.step());
      add(state, g);
    }
    if (g.params.empty()) {
      continue;
    }
    std::vector<at::Tensor> tensors = g.params;
    tensors.insert(tensors.end(), g.grads.begin(), g.grads.end());
    if (internal::use_foreach(o.foreach(), o.fused(), tensors, Opt::kName, gi)) {
      foreach(g, o);
      continue;
    }
    tensors.insert(tensors.end(), g.exp_avgs.begin(), g.exp_avgs.end());
    tensors.insert(tensors.end(), g.seconds.begin(), g.seconds.end());
    dispatch_fused(
        o.fused(), tensors, Opt::kName, gi, [&](auto type) { fused(type, g, o); }, [&] { reference(g, o); });
  }
}

}  // namespace trainkit::optim::detail
