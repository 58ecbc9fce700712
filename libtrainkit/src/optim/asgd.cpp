#include "trainkit/optim/asgd.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <torch/optim/serialize.h>

#include "optim/detail/common.h"
#include "optim/detail/gather.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

void AsgdParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eta);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(mu);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(ax);
}

void AsgdParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eta);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, mu);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, ax);
}

namespace {

using AsgdGroup = detail::Gathered<AsgdParamState>;

/// `x` rounded to float32, as torch.optim keeps eta and mu (0-dim tensors of the default dtype).
double as_float32(double x) { return static_cast<double>(static_cast<float>(x)); }

/// PyTorch's single-tensor ASGD op for op (`foreach`: the same ops over the whole group; `add` with one
/// alpha per call, so the tensors go in runs of equal eta). Any device; eta and mu stay on the host.
void asgd_tensor_group(const AsgdGroup& g, const AsgdOptions& o, const at::Tensor& inv_scale, bool foreach) {
  std::vector<at::Tensor> params = g.params;
  auto axs = g.of([](AsgdParamState& s) { return s.ax(); });
  const auto grads = detail::effective_grads(g.grads, params, inv_scale, o.maximize(), o.weight_decay(), foreach);
  const size_t n = params.size();
  if (foreach) {
    std::vector<at::Scalar> decay;
    std::map<double, std::vector<size_t>> by_eta;
    for (size_t i = 0; i < n; ++i) {
      decay.emplace_back(1 - o.lambd() * g.states[i]->eta());
      by_eta[g.states[i]->eta()].push_back(i);
    }
    at::_foreach_mul_(params, decay);
    for (const auto& [eta, members] : by_eta) {
      std::vector<at::Tensor> p;
      std::vector<at::Tensor> d;
      for (const size_t i : members) {
        p.push_back(params[i]);
        d.push_back(grads[i]);
      }
      at::_foreach_add_(p, d, -eta);
    }
    std::vector<at::Tensor> averaged;
    std::vector<at::Tensor> averaged_params;
    std::vector<at::Scalar> mus;
    for (size_t i = 0; i < n; ++i) {
      if (g.states[i]->mu() != 1) {
        averaged.push_back(axs[i]);
        averaged_params.push_back(params[i]);
        mus.emplace_back(g.states[i]->mu());
      } else {
        axs[i].copy_(params[i]);
      }
    }
    if (!averaged.empty()) {
      auto diff = at::_foreach_sub(averaged_params, averaged);
      at::_foreach_mul_(diff, mus);
      at::_foreach_add_(averaged, diff);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const double eta = g.states[i]->eta();
      params[i].mul_(1 - o.lambd() * eta);
      params[i].add_(grads[i], -eta);
      if (g.states[i]->mu() != 1) {
        axs[i].add_(params[i].sub(axs[i]).mul_(g.states[i]->mu()));
      } else {
        axs[i].copy_(params[i]);
      }
    }
  }
  for (AsgdParamState* s : g.states) {
    const auto t = static_cast<double>(s->step());
    s->eta(as_float32(o.lr() / std::pow(1 + o.lambd() * o.lr() * t, o.alpha())));
    s->mu(as_float32(1 / std::max(1.0, t - o.t0())));
  }
}

}  // namespace

bool register_asgd_optimizer() {
  register_optimizer(OptimizerBinding<Asgd>("asgd").entry());
  return true;
}

void Asgd::update(const at::Tensor& inv_scale) {
  const auto init = [](AsgdParamState& s, const at::Tensor& p, const AsgdOptions& o) {
    s.eta(as_float32(o.lr()));
    s.mu(1);
    s.ax(at::zeros_like(p, at::MemoryFormat::Preserve));
  };
  detail::for_each_group(*this, init, [&](size_t gi, const AsgdOptions& o, AsgdGroup& g) {
    asgd_tensor_group(g, o, inv_scale, internal::use_foreach(o.foreach(), std::nullopt, g.values(), kName, gi));
  });
}

}  // namespace trainkit::optim
