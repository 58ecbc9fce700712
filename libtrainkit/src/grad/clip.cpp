#include "trainkit/grad/clip.h"

#include <cmath>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

#include "optim/detail/common.h"

namespace trainkit::grad {
namespace {

/// Σ|x|^p (or max |x| for p = inf) over one chunk, accumulated in double.
template <class T>
double chunk_reduce(const T* x, int64_t n, double p) {
  if (p == 2.0) {
    return optim::detail::sum_squares(x, n);
  }
  if (std::isinf(p)) {
    double m = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double a = std::abs(static_cast<double>(x[i]));
      m = (a > m || std::isnan(a)) ? a : m;
    }
    return m;
  }
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    s += p == 1.0 ? std::abs(static_cast<double>(x[i])) : std::pow(std::abs(static_cast<double>(x[i])), p);
  }
  return s;
}

/// The total norm on the fused path: one parallel pass (the chunking trainkit's fused optimizers use),
/// partial results combined in a fixed order so that the result does not depend on the thread count.
template <class T>
double fused_norm(const std::vector<at::Tensor>& grads, double p) {
  const auto chunks = optim::detail::make_chunks(optim::detail::numels_of(grads));
  std::vector<double> partial(chunks.size(), 0.0);
  optim::detail::for_each_chunk(chunks, [&](const optim::detail::Chunk& c) {
    partial[static_cast<size_t>(&c - chunks.data())] =
        chunk_reduce(grads[static_cast<size_t>(c.tensor)].data_ptr<T>() + c.begin, c.n, p);
  });
  if (std::isinf(p)) {
    double m = 0;
    for (const double v : partial) {
      m = (v > m || std::isnan(v)) ? v : m;
    }
    return m;
  }
  double s = 0;
  for (const double v : partial) {
    s += v;
  }
  return p == 2.0 ? std::sqrt(s) : (p == 1.0 ? s : std::pow(s, 1.0 / p));
}

template <class T>
void fused_scale(const std::vector<at::Tensor>& grads, T coef) {
  const auto chunks = optim::detail::make_chunks(optim::detail::numels_of(grads));
  optim::detail::for_each_chunk(chunks, [&](const optim::detail::Chunk& c) {
    optim::detail::scale(grads[static_cast<size_t>(c.tensor)].data_ptr<T>() + c.begin, c.n, coef);
  });
}

/// Gradients that the fused path can take: contiguous float32/float64 on the CPU, all of one dtype.
bool fusable(const std::vector<at::Tensor>& grads) {
  return !grads.empty() && optim::detail::fusable(grads, nullptr);
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
      if (g.is_sparse()) {
        throw std::invalid_argument(fmt::format("clip_grad_norm_: parameter {} has a sparse gradient (unsupported)", i));
      }
      out.tensors.push_back(g);
      out.index.push_back(i);
    }
  }
  return out;
}

void check_norm_type(double norm_type) {
  if (!(norm_type > 0) || std::isnan(norm_type)) {
    throw std::invalid_argument(fmt::format("clip_grad_norm_: invalid norm_type: {} (must be > 0 or inf)", norm_type));
  }
}

/// The total norm as a 0-dim tensor of the gradients' dtype on the first gradient's device.
at::Tensor total_norm_of(const std::vector<at::Tensor>& grads, double p) {
  if (grads.empty()) {
    return torch::zeros({});
  }
  const auto& first = grads.front();
  if (fusable(grads)) {
    const double n = first.scalar_type() == at::kFloat ? fused_norm<float>(grads, p) : fused_norm<double>(grads, p);
    return torch::tensor(n, first.options().dtype(first.scalar_type()));
  }
  // Reference path: per (device, dtype) group, ATen's foreach norms, then the norm of the norms.
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> groups;
  for (const auto& g : grads) {
    groups[{g.device().str(), g.scalar_type()}].push_back(g);
  }
  std::vector<at::Tensor> norms;
  for (auto& [key, list] : groups) {
    for (auto& n : at::_foreach_norm(list, p)) {
      norms.push_back(n.to(first.device()));
    }
  }
  return at::linalg_vector_norm(torch::stack(norms), p);
}

at::Tensor clip_impl(const std::vector<at::Tensor>& parameters, const std::vector<std::string>* names,
                     double max_norm, double norm_type, bool error_if_nonfinite) {
  check_norm_type(norm_type);
  if (!(max_norm >= 0)) {
    throw std::invalid_argument(fmt::format("clip_grad_norm_: invalid max_norm: {} (must be >= 0)", max_norm));
  }
  torch::NoGradGuard no_grad;
  const Grads grads = grads_of(parameters);
  const at::Tensor total = total_norm_of(grads.tensors, norm_type);
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
  // As PyTorch: coef = max_norm / (total + 1e-6) computed in the norm's dtype, clamped at 1.
  const at::Tensor coef = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  if (fusable(grads.tensors)) {
    // On the CPU reading the coefficient is free, and a coefficient of 1 needs no pass at all.
    if (grads.tensors.front().scalar_type() == at::kFloat) {
      const float c = coef.item<float>();
      if (c < 1.0f) {
        fused_scale<float>(grads.tensors, c);
      }
    } else {
      const double c = coef.item<double>();
      if (c < 1.0) {
        fused_scale<double>(grads.tensors, c);
      }
    }
    return total;
  }
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> groups;
  for (const auto& g : grads.tensors) {
    groups[{g.device().str(), g.scalar_type()}].push_back(g);
  }
  for (auto& [key, list] : groups) {
    at::_foreach_mul_(list, coef.to(list.front().device()));
  }
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

at::Tensor grad_norm(const std::vector<at::Tensor>& parameters, double norm_type) {
  check_norm_type(norm_type);
  torch::NoGradGuard no_grad;
  return total_norm_of(grads_of(parameters).tensors, norm_type);
}

void clip_grad_value_(const std::vector<at::Tensor>& parameters, double clip_value) {
  if (!(clip_value >= 0)) {
    throw std::invalid_argument(fmt::format("clip_grad_value_: invalid clip_value: {} (must be >= 0)", clip_value));
  }
  torch::NoGradGuard no_grad;
  for (const auto& p : parameters) {
    if (p.grad().defined()) {
      p.grad().clamp_(-clip_value, clip_value);
    }
  }
}

}  // namespace trainkit::grad
