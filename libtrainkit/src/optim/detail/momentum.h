#pragma once
// The step shared by Sgd and Lars: optional trust ratio (LARS), L2 decay, momentum/nesterov, fused or ATen.

#include <array>
#include <cmath>
#include <optional>
#include <type_traits>
#include <vector>

#include "optim/detail/common.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim::detail {

/// The hyperparameters of one group of Sgd or Lars, set by name (the LARS fields stay at their defaults for Sgd).
struct MomentumHyper {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false;
  bool adapt = false;  // LARS trust ratio on
  double trust_coefficient = 0, eps = 0;
  bool trust_clip = false;
  std::optional<bool> fused;
  std::optional<bool> foreach;
  std::optional<bool> aten_fused = false;  // Sgd's option; LARS has no ATen kernel
};

/// The fields Sgd's and Lars's Options share (see bind_momentum_fields), the others at their defaults.
template <class Options>
MomentumHyper momentum_hyper(const Options& o) {
  MomentumHyper h;
  h.lr = o.lr();
  h.momentum = o.momentum();
  h.dampening = o.dampening();
  h.weight_decay = o.weight_decay();
  h.nesterov = o.nesterov();
  h.fused = o.fused();
  h.foreach = o.foreach();
  return h;
}

/// LARS's trust ratio from the two norms (timm's _lars_trust_ratio).
inline double lars_trust_ratio(double w_norm, double g_norm, const MomentumHyper& h) {
  double ratio = h.trust_coefficient * w_norm / (g_norm + w_norm * h.weight_decay + h.eps);
  if (!(w_norm > 0) || !(g_norm > 0)) {
    ratio = 1.0;
  }
  return h.trust_clip ? std::min(ratio / h.lr, 1.0) : ratio;
}

struct MomentumGroup {
  std::vector<at::Tensor> params, grads, buffers;
  std::vector<bool> first;  // momentum buffer created in this step
};

/// The fused step of one group whose parameters have element type P (float, double, c10::BFloat16, c10::Half;
/// the last two only without the LARS trust ratio).
template <class P>
void fused_momentum(const MomentumGroup& g, const MomentumHyper& h, double grad_mul) {
  using T = typename KernelTypes<P>::math;
  const auto numels = numels_of(g.params);
  std::vector<SgdCoef<T>> coefs;
  std::vector<MomentumMode> modes;
  for (size_t t = 0; t < g.params.size(); ++t) {
    SgdCoef<T> c{};
    c.grad_mul = static_cast<T>(grad_mul);
    c.l2 = static_cast<T>(h.weight_decay);
    c.trust = T(1);
    c.momentum = static_cast<T>(h.momentum);
    c.keep = static_cast<T>(1 - h.dampening);
    c.lr = static_cast<T>(h.lr);
    c.nesterov = h.nesterov;
    coefs.push_back(c);
    modes.push_back(h.momentum == 0 ? MomentumMode::kNone
                                    : (g.first[t] ? MomentumMode::kFirst : MomentumMode::kRunning));
  }
  const auto update = [&](const Chunk& c) {
    const auto t = static_cast<size_t>(c.tensor);
    T* buf = h.momentum == 0 ? nullptr : g.buffers[t].data_ptr<T>() + c.begin;
    sgd_kernel(kernel_data<P>(g.params[t], c.begin), kernel_data<P>(g.grads[t], c.begin), buf, c.n, coefs[t],
               modes[t]);
  };
  if (!h.adapt) {
    for_each_even(numels, update);
    return;
  }
  if constexpr (std::is_same_v<P, T>) {  // never reduced precision: dispatch rejects it for LARS
    // LARS: norms of w and g, then the update, block by block so that the update re-reads from cache.
    two_phase_blocks<2>(
        numels,
        [&](const Chunk& c, std::array<double, 2>& sums) {
          const auto t = static_cast<size_t>(c.tensor);
          sum_squares2(g.params[t].data_ptr<T>() + c.begin, g.grads[t].data_ptr<T>() + c.begin, c.n, sums[0],
                       sums[1]);
        },
        [&](size_t t, const std::array<double, 2>& sums) {
          const double g_norm = std::abs(grad_mul) * std::sqrt(sums[1]);
          coefs[t].trust = static_cast<T>(lars_trust_ratio(std::sqrt(sums[0]), g_norm, h));
        },
        update);
  }
}

/// The trust ratio of reference_momentum from norms (0-dim, or stacked: elementwise), on their device (no host
/// read).
inline at::Tensor lars_trust_ratio(const at::Tensor& w_norm, const at::Tensor& g_norm, const MomentumHyper& h) {
  at::Tensor ratio = h.trust_coefficient * w_norm / (g_norm + w_norm * h.weight_decay + h.eps);
  const at::Tensor one = at::ones_like(ratio);
  ratio = at::where(w_norm > 0, at::where(g_norm > 0, ratio, one), one);
  return h.trust_clip ? at::clamp_max(ratio / h.lr, 1.0) : ratio;
}

/// timm's _single_tensor_lars / PyTorch's single-tensor SGD, op for op, with no host sync; bfloat16/float16
/// parameters are computed in float32 and rounded once at the end, as in the fused kernel.
inline void reference_momentum(MomentumGroup& g, const MomentumHyper& h, const at::Tensor& inv_scale) {
  for (size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor param = g.params[i];
    const auto work = internal::state_dtype(param.scalar_type());
    at::Tensor p = in_dtype(param, work);
    at::Tensor d = in_dtype(g.grads[i], work);
    if (inv_scale.defined()) {
      d = d * inv_scale.to(d.device());
    }
    if (h.maximize) {
      d = -d;
    }
    if (h.adapt) {
      const at::Tensor ratio = lars_trust_ratio(p.norm(2), d.norm(2), h);
      d = d.add(p, h.weight_decay).mul_(ratio);
    } else if (h.weight_decay != 0) {
      d = d.add(p, h.weight_decay);
    }
    if (h.momentum != 0) {
      if (g.first[i]) {
        g.buffers[i].copy_(d);
      } else {
        g.buffers[i].mul_(h.momentum).add_(d, 1 - h.dampening);
      }
      d = h.nesterov ? d.add(g.buffers[i], h.momentum) : g.buffers[i];
    }
    p.add_(d, -h.lr);
    write_back(param, p);
  }
}

/// reference_momentum with multi-tensor ops (`_foreach_*`, the norms by `_foreach_norm`): the same ops in the
/// same order over the whole group, no host read.
inline void foreach_momentum(MomentumGroup& g, const MomentumHyper& h, const at::Tensor& inv_scale) {
  const size_t n = g.params.size();
  std::vector<at::Tensor> p(n), d(n);
  for (size_t i = 0; i < n; ++i) {
    const auto work = internal::state_dtype(g.params[i].scalar_type());
    p[i] = in_dtype(g.params[i], work);
    d[i] = in_dtype(g.grads[i], work);
  }
  if (inv_scale.defined()) {
    d = at::_foreach_mul(d, inv_scale.to(d.front().device()));
  }
  if (h.maximize) {
    d = at::_foreach_neg(d);
  }
  if (h.adapt) {
    const std::vector<at::Tensor> ratios = trust_ratios(
        at::_foreach_norm(p, 2), at::_foreach_norm(d, 2),
        [&](const at::Tensor& w, const at::Tensor& g) { return lars_trust_ratio(w, g, h); });
    d = at::_foreach_add(d, p, h.weight_decay);
    at::_foreach_mul_(d, ratios);
  } else if (h.weight_decay != 0) {
    d = at::_foreach_add(d, p, h.weight_decay);
  }
  if (h.momentum != 0) {
    std::vector<at::Tensor> bufs, ds;
    for (size_t i = 0; i < n; ++i) {
      if (g.first[i]) {
        g.buffers[i].copy_(d[i]);
      } else {
        bufs.push_back(g.buffers[i]);
        ds.push_back(d[i]);
      }
    }
    if (!bufs.empty()) {
      at::_foreach_mul_(bufs, h.momentum);
      at::_foreach_add_(bufs, ds, 1 - h.dampening);
    }
    d = h.nesterov ? at::_foreach_add(d, g.buffers, h.momentum) : g.buffers;
  }
  at::_foreach_add_(p, d, -h.lr);
  for (size_t i = 0; i < n; ++i) {
    write_back(g.params[i], p[i]);
  }
}

/// ATen's `_fused_sgd_` on one group (no trust ratio). The kernel takes one is_first_step for its whole
/// list, so buffers created in this step and running ones go in two calls. A buffer created in a step that
/// `found_inf` skips on the device is zero (the kernel leaves it as it was).
inline void aten_fused_momentum(const MomentumGroup& g, const MomentumHyper& h, const StepScaling& scaling) {
  const AtenScaling a = aten_scaling(g.grads, scaling, g.params.front().device());
  const std::vector<at::Tensor>& grads = a.grads;
  const auto run = [&](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& gs,
                       const std::vector<at::Tensor>& bufs, bool first) {
    at::_fused_sgd_(params, gs, bufs, h.weight_decay, h.momentum, h.lr, h.dampening, h.nesterov, h.maximize, first,
                    a.grad_scale, a.found_inf);
  };
  if (h.momentum == 0) {
    run(g.params, grads, {}, false);
    return;
  }
  for (const bool first : {true, false}) {
    std::vector<at::Tensor> params, gs, bufs;
    for (size_t i = 0; i < g.params.size(); ++i) {
      if (g.first[i] == first) {
        params.push_back(g.params[i]);
        gs.push_back(grads[i]);
        bufs.push_back(g.buffers[i]);
        if (first && a.found_inf.has_value()) {
          g.buffers[i].zero_();
        }
      }
    }
    if (!params.empty()) {
      run(params, gs, bufs, first);
    }
  }
}

/// One step of every group of `opt` (Sgd or Lars); `hyper_of(options)` reads a group's hyperparameters.
template <class Opt, class HyperOf>
void momentum_update(Opt& opt, const HyperOf& hyper_of, const StepScaling& scaling) {
  const at::Tensor& inv_scale = scaling.inv_scale;
  using Options = typename Opt::options_type;
  using State = typename Opt::param_state_type;
  auto& groups = opt.param_groups();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const MomentumHyper h = hyper_of(static_cast<const Options&>(groups[gi].options()));
    MomentumGroup g;
    const auto& params = groups[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (!p.grad().defined()) {
        continue;
      }
      g.params.push_back(p);
      g.grads.push_back(internal::checked_grad(p, gi, i, Opt::kName));
      if (h.momentum != 0) {
        auto& state = internal::param_state<State>(opt, p, [](State&) {});
        const bool first = !state.momentum_buffer().defined();
        if (first) {
          // bfloat16/float16 parameters keep a float32 buffer (internal::state_dtype).
          state.momentum_buffer(at::empty_like(p, p.options().dtype(internal::state_dtype(p.scalar_type())),
                                               at::MemoryFormat::Preserve));
        }
        g.buffers.push_back(state.momentum_buffer());
        g.first.push_back(first);
      } else {
        g.first.push_back(false);
      }
    }
    if (g.params.empty()) {
      continue;
    }
    std::vector<at::Tensor> values = g.params;
    values.insert(values.end(), g.grads.begin(), g.grads.end());
    if (internal::use_aten_fused(h.aten_fused, h.fused, h.foreach, g.params, Opt::kName, gi)) {
      std::vector<at::Tensor> all = values;
      all.insert(all.end(), g.buffers.begin(), g.buffers.end());
      internal::check_aten_fusable(all, Opt::kName, gi);
      aten_fused_momentum(g, h, scaling);
      continue;
    }
    check_host_found_inf(scaling, Opt::kName, gi);
    if (internal::use_foreach(h.foreach, h.fused, values, Opt::kName, gi)) {
      foreach_momentum(g, h, inv_scale);
      continue;
    }
    // The LARS trust ratio's norms take float32/float64 only.
    dispatch_fused(
        h.fused, values, g.buffers, /*reduced_ok=*/!h.adapt, Opt::kName, gi,
        [&](auto type) {
          const double grad_mul = (h.maximize ? -1.0 : 1.0) * cpu_scalar(inv_scale, 1.0);
          fused_momentum<decltype(type)>(g, h, grad_mul);
        },
        [&] { reference_momentum(g, h, inv_scale); });
  }
}

}  // namespace trainkit::optim::detail
