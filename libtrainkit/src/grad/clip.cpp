#include "trainkit/grad/clip.h"

#include <cmath>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

#include "detail/check.h"
#include "detail/parallel.h"

namespace trainkit::grad {
namespace {

template <class T>
void fused_scale(const std::vector<at::Tensor>& grads, T coef) {
  detail::for_each_chunk(detail::make_chunks(detail::numels_of(grads)), [&](const detail::Chunk& c) {
    detail::scale(grads[static_cast<size_t>(c.tensor)].data_ptr<T>() + c.begin, c.n, coef);
  });
}

/// Gradients that the fused path can take: contiguous float32/float64 on the CPU, all of one dtype.
bool fusable(const std::vector<at::Tensor>& grads) {
  return !grads.empty() && detail::fusable(grads, nullptr);
}

struct Grads {
  std::vector<at::Tensor> tensors;
  std::vector<size_t> index;  // position of each in the parameter list
};

Grads grads_of(const std::vector<at::Tensor>& parameters) {
  Grads out;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& g = parameters[i].grad();
    if (g.defined()) {
      TRAINKIT_CHECK_ARG(!g.is_sparse(), "clip_grad_norm_: parameter {} has a sparse gradient (unsupported)", i);
      out.tensors.push_back(g);
      out.index.push_back(i);
    }
  }
  return out;
}

void check_norm_type(double norm_type) {
  TRAINKIT_CHECK_ARG(norm_type > 0 && !std::isnan(norm_type),
                     "clip_grad_norm_: invalid norm_type: {} (must be > 0 or inf)", norm_type);
}

/// g ← g · min(1, max_norm / (total + 1e-6)) for every gradient, the coefficient computed in the norm's dtype
/// as PyTorch does and applied in each gradient's dtype.
void scale_by_norm(const std::vector<at::Tensor>& grads, double max_norm, const at::Tensor& total) {
  if (grads.empty()) {
    return;
  }
  torch::NoGradGuard no_grad;
  const at::Tensor coef = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  if (fusable(grads)) {
    // On the CPU reading the coefficient is free (its memory, not a device sync), and a coefficient of 1
    // needs no pass at all.
    if (grads.front().scalar_type() == at::kFloat) {
      const float c = *coef.to(at::kFloat).data_ptr<float>();
      if (c < 1.0f) {
        fused_scale<float>(grads, c);
      }
    } else {
      const double c = *coef.to(at::kDouble).data_ptr<double>();
      if (c < 1.0) {
        fused_scale<double>(grads, c);
      }
    }
    return;
  }
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> groups;
  for (const auto& g : grads) {
    groups[{g.device().str(), g.scalar_type()}].push_back(g);
  }
  for (auto& [key, list] : groups) {
    at::_foreach_mul_(list, coef.to(list.front().device(), key.second));
  }
}

at::Tensor clip_impl(const std::vector<at::Tensor>& parameters, const std::vector<std::string>* names,
                     double max_norm, double norm_type, bool error_if_nonfinite) {
  check_norm_type(norm_type);
  TRAINKIT_CHECK_ARG(max_norm >= 0, "clip_grad_norm_: invalid max_norm: {} (must be >= 0)", max_norm);
  torch::NoGradGuard no_grad;
  const Grads grads = grads_of(parameters);
  const at::Tensor total = detail::total_norm(grads.tensors, norm_type);
  if (grads.tensors.empty()) {
    return total;
  }
  if (error_if_nonfinite && !std::isfinite(total.item<double>())) {
    for (size_t k = 0; k < grads.tensors.size(); ++k) {
      if (!grads.tensors[k].isfinite().all().item<bool>()) {
        const size_t i = grads.index[k];
        const std::string who = names != nullptr ? fmt::format("'{}'", (*names)[i]) : fmt::format("{}", i);
        throw std::runtime_error(fmt::format(
            "clip_grad_norm_: the total norm of order {} is non-finite ({}); parameter {} has a non-finite "
            "gradient (pass error_if_nonfinite = false to clip anyway)",
            norm_type, total.item<double>(), who));
      }
    }
  }
  scale_by_norm(grads.tensors, max_norm, total);
  return total;
}

}  // namespace

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                           bool error_if_nonfinite) {
  return clip_impl(parameters, nullptr, max_norm, norm_type, error_if_nonfinite);
}

at::Tensor clip_grad_norm_(const torch::OrderedDict<std::string, at::Tensor>& named_parameters, double max_norm,
                           double norm_type, bool error_if_nonfinite) {
  std::vector<std::string> names = named_parameters.keys();
  return clip_impl(named_parameters.values(), &names, max_norm, norm_type, error_if_nonfinite);
}

void clip_grads_with_norm_(const std::vector<at::Tensor>& parameters, double max_norm, const at::Tensor& total_norm) {
  TRAINKIT_CHECK_ARG(max_norm >= 0, "clip_grads_with_norm_: invalid max_norm: {} (must be >= 0)", max_norm);
  scale_by_norm(grads_of(parameters).tensors, max_norm, total_norm);
}

at::Tensor grad_norm(const std::vector<at::Tensor>& parameters, double norm_type) {
  check_norm_type(norm_type);
  torch::NoGradGuard no_grad;
  return detail::total_norm(grads_of(parameters).tensors, norm_type);
}

void clip_grad_value_(const std::vector<at::Tensor>& parameters, double clip_value) {
  TRAINKIT_CHECK_ARG(clip_value >= 0, "clip_grad_value_: invalid clip_value: {} (must be >= 0)", clip_value);
  torch::NoGradGuard no_grad;
  for (const auto& p : parameters) {
    if (p.grad().defined()) {
      p.grad().clamp_(-clip_value, clip_value);
    }
  }
}

}  // namespace trainkit::grad
