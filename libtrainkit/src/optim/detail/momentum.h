#pragma once
// The step shared by Sgd and Lars: optional trust ratio (LARS), L2 decay, momentum/nesterov, fused or ATen.

#include <cmath>
#include <optional>
#include <vector>

#include "optim/detail/common.h"

namespace trainkit::optim::detail {

struct MomentumHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, maximize;
  bool adapt;  // LARS trust ratio on
  double trust_coefficient, eps;
  bool trust_clip;
  std::optional<bool> fused;
};

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

template <class T>
void fused_momentum(const MomentumGroup& g, const MomentumHyper& h, double grad_mul) {
  const auto numels = numels_of(g.params);
  std::vector<SgdCoef<T>> coefs;
  std::vector<MomentumMode> modes;
  for (size_t t = 0; t < g.params.size(); ++t) {
    coefs.push_back({static_cast<T>(grad_mul), static_cast<T>(h.weight_decay), T(1), static_cast<T>(h.momentum),
                     static_cast<T>(1 - h.dampening), static_cast<T>(h.lr), h.nesterov});
    modes.push_back(h.momentum == 0 ? MomentumMode::kNone
                                    : (g.first[t] ? MomentumMode::kFirst : MomentumMode::kRunning));
  }
  const auto update = [&](const std::vector<Chunk>& chunks) {
    for_each_chunk(chunks, [&](const Chunk& c) {
      const auto t = static_cast<size_t>(c.tensor);
      T* buf = h.momentum == 0 ? nullptr : g.buffers[t].data_ptr<T>() + c.begin;
      sgd_kernel(g.params[t].data_ptr<T>() + c.begin, g.grads[t].data_ptr<T>() + c.begin, buf, c.n, coefs[t],
                 modes[t]);
    });
  };
  if (!h.adapt) {
    update(make_chunks(numels));
    return;
  }
  // LARS: norms of w and g, then the update, block by block so that the update re-reads from cache.
  for (const auto& [first, last] : make_blocks(numels)) {
    const auto chunks = make_chunks(numels, first, last);
    // Per-chunk partial sums, combined per tensor in chunk order: independent of the thread count.
    std::vector<double> sp(chunks.size(), 0.0);
    std::vector<double> sg(chunks.size(), 0.0);
    at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const Chunk& ch = chunks[static_cast<size_t>(c)];
        const auto t = static_cast<size_t>(ch.tensor);
        sum_squares2(g.params[t].data_ptr<T>() + ch.begin, g.grads[t].data_ptr<T>() + ch.begin, ch.n,
                     sp[static_cast<size_t>(c)], sg[static_cast<size_t>(c)]);
      }
    });
    std::vector<double> wp(g.params.size(), 0.0);
    std::vector<double> wg(g.params.size(), 0.0);
    for (size_t c = 0; c < chunks.size(); ++c) {
      wp[static_cast<size_t>(chunks[c].tensor)] += sp[c];
      wg[static_cast<size_t>(chunks[c].tensor)] += sg[c];
    }
    for (size_t t = first; t < last; ++t) {
      coefs[t].trust = static_cast<T>(lars_trust_ratio(std::sqrt(wp[t]), std::abs(grad_mul) * std::sqrt(wg[t]), h));
    }
    update(chunks);
  }
}

/// timm's _single_tensor_lars / PyTorch's single-tensor SGD, op for op, with no host sync.
inline void reference_momentum(MomentumGroup& g, const MomentumHyper& h, const at::Tensor& inv_scale) {
  for (size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor p = g.params[i];
    at::Tensor d = inv_scale.defined() ? g.grads[i] * inv_scale.to(g.grads[i].device()) : g.grads[i];
    if (h.maximize) {
      d = -d;
    }
    if (h.adapt) {
      const at::Tensor w_norm = p.norm(2);
      const at::Tensor g_norm = d.norm(2);
      at::Tensor ratio = h.trust_coefficient * w_norm / (g_norm + w_norm * h.weight_decay + h.eps);
      const at::Tensor one = at::ones_like(ratio);
      ratio = at::where(w_norm > 0, at::where(g_norm > 0, ratio, one), one);
      if (h.trust_clip) {
        ratio = at::clamp_max(ratio / h.lr, 1.0);
      }
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
  }
}

/// One step of every group of `opt`; `hyper_of(options)` reads a group's hyperparameters.
template <class State, class Options, class HyperOf>
void momentum_step(torch::optim::Optimizer& opt, const HyperOf& hyper_of, const char* name,
                   const at::Tensor& inv_scale) {
  at::NoGradGuard no_grad;
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
      g.grads.push_back(checked_grad(p, gi, i, name));
      if (h.momentum != 0) {
        auto& state = param_state<State>(opt, p, [](State&) {});
        const bool first = !state.momentum_buffer().defined();
        if (first) {
          state.momentum_buffer(at::empty_like(p, at::MemoryFormat::Preserve));
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
    std::vector<at::Tensor> all = g.params;
    all.insert(all.end(), g.grads.begin(), g.grads.end());
    all.insert(all.end(), g.buffers.begin(), g.buffers.end());
    if (use_fused(h.fused, all, name, gi)) {
      const double grad_mul = (h.maximize ? -1.0 : 1.0) * cpu_scalar(inv_scale, 1.0);
      if (g.params.front().scalar_type() == at::kFloat) {
        fused_momentum<float>(g, h, grad_mul);
      } else {
        fused_momentum<double>(g, h, grad_mul);
      }
    } else {
      reference_momentum(g, h, inv_scale);
    }
  }
}

/// Validation shared by Sgd and Lars.
inline void validate_momentum(const MomentumHyper& h, const char* name) {
  check_option(h.lr >= 0, name, "learning rate (lr)", h.lr);
  check_option(h.momentum >= 0, name, "momentum", h.momentum);
  check_option(h.weight_decay >= 0, name, "weight_decay", h.weight_decay);
  check_option(h.eps >= 0, name, "epsilon (eps)", h.eps);
  if (h.nesterov && (h.momentum <= 0 || h.dampening != 0)) {
    throw std::invalid_argument(fmt::format("{}: nesterov momentum requires a momentum > 0 and zero dampening "
                                            "(momentum = {}, dampening = {})",
                                            name, h.momentum, h.dampening));
  }
}

}  // namespace trainkit::optim::detail
