#pragma once
// The per-group gathering the element-wise optimizers share (Adagrad, Adadelta, ASGD, Rprop): each param
// group's parameters that have a gradient, their dense gradients (times the unscale factor, where the
// step is GradScaler's) and their states, created on first use; the step count of each advanced.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "trainkit/optim/optimizer_base.h"

namespace trainkit::optim::detail {

/// One param group's parameters that have a gradient, in order, with their gradients and states.
template <class State>
struct Gathered {
  std::vector<at::Tensor> params, grads;
  std::vector<State*> states;

  /// `get(state)` of every state (a state tensor: `[](auto& s) { return s.sum(); }`).
  template <class Get>
  std::vector<at::Tensor> of(const Get& get) const {
    std::vector<at::Tensor> out;
    out.reserve(states.size());
    for (State* s : states) {
      out.push_back(get(*s));
    }
    return out;
  }
  /// The parameters, then the gradients (what decides a group's path).
  std::vector<at::Tensor> values() const {
    std::vector<at::Tensor> out = params;
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  }
};

/// Calls `step(group index, options, gathered)` for every param group of `opt` with a gradient: the states
/// are created by `init(state, param, options)` on first use and their `step` count is advanced by one.
template <class Opt, class Init, class Step>
void for_each_group(Opt& opt, const Init& init, const Step& step) {
  using Options = typename Opt::options_type;
  using State = typename Opt::param_state_type;
  auto& groups = opt.param_groups();
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const Options& o = static_cast<const Options&>(groups[gi].options());
    Gathered<State> g;
    const auto& params = groups[gi].params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (!p.grad().defined()) {
        continue;
      }
      g.grads.push_back(internal::checked_grad(p, gi, i, Opt::kName));
      g.params.push_back(p);
      State& s = internal::param_state<State>(opt, p, [&](State& fresh) { init(fresh, p, o); });
      s.step(s.step() + 1);
      g.states.push_back(&s);
    }
    if (!g.params.empty()) {
      step(gi, o, g);
    }
  }
}

/// `grads` multiplied by `inv_scale` (GradScaler's unscale; undefined: as they are), negated for `maximize`,
/// and with the L2 penalty `weight_decay·p` added, as PyTorch's single-tensor step writes it (`-g`, then
/// `g.add(p, alpha=weight_decay)`): new tensors where any applies, through `_foreach_*` ops when `foreach`.
inline std::vector<at::Tensor> effective_grads(std::vector<at::Tensor> grads, const std::vector<at::Tensor>& params,
                                               const at::Tensor& inv_scale, bool maximize, double weight_decay,
                                               bool foreach) {
  if (foreach) {
    if (inv_scale.defined()) {
      grads = at::_foreach_mul(grads, inv_scale.to(grads.front().device()));
    }
    if (maximize) {
      grads = at::_foreach_neg(grads);
    }
    return weight_decay != 0 ? at::_foreach_add(grads, params, weight_decay) : grads;
  }
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (inv_scale.defined()) {
      grads[i] = grads[i] * inv_scale.to(grads[i].device());
    }
    if (maximize) {
      grads[i] = -grads[i];
    }
    if (weight_decay != 0) {
      grads[i] = grads[i].add(params[i], weight_decay);
    }
  }
  return grads;
}

}  // namespace trainkit::optim::detail
