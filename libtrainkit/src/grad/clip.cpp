#include "trainkit/grad/clip.h"

#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

namespace trainkit::grad {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// A slice of one gradient processed by one task of the fused kernels.
struct Chunk {
  void* data;
  int64_t n;
};

/// Gradients that the fused path can take: contiguous float32/float64 on the CPU, all of one dtype.
bool fusable(const std::vector<at::Tensor>& grads) {
  if (grads.empty()) {
    return false;
  }
  const auto dtype = grads.front().scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble) {
    return false;
  }
  for (const auto& g : grads) {
    if (!g.device().is_cpu() || g.scalar_type() != dtype || !g.is_contiguous() || g.is_sparse()) {
      return false;
    }
  }
  return true;
}

/// Splits all gradients into chunks of at most `grain` elements, so that many small tensors and a few
/// large ones spread alike over threads with no per-tensor dispatch.
std::vector<Chunk> chunks_of(const std::vector<at::Tensor>& grads, int64_t grain) {
  std::vector<Chunk> out;
  for (const auto& g : grads) {
    auto* base = static_cast<char*>(g.data_ptr());
    const int64_t n = g.numel();
    const auto elem = static_cast<int64_t>(g.element_size());
    for (int64_t start = 0; start < n; start += grain) {
      out.push_back({base + start * elem, std::min(grain, n - start)});
    }
  }
  return out;
}

constexpr int64_t kGrain = 1 << 16;

// The hot loops are compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time (GCC's
// function multiversioning), so one binary uses the widest vectors the CPU has.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TRAINKIT_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TRAINKIT_MULTIVERSION
#endif

constexpr int64_t kLanes = 8;

/// Σ x² in double with eight independent accumulators (vectorizable without reassociating a sum).
template <class T>
inline double sum_squares(const T* x, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) {
      const double v = static_cast<double>(x[i + k]);
      acc[k] += v * v;
    }
  }
  double s = 0;
  for (; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    s += v * v;
  }
  for (double a : acc) {
    s += a;
  }
  return s;
}

TRAINKIT_MULTIVERSION double sum_squares_f32(const float* x, int64_t n) { return sum_squares(x, n); }
TRAINKIT_MULTIVERSION double sum_squares_f64(const double* x, int64_t n) { return sum_squares(x, n); }
TRAINKIT_MULTIVERSION void scale_f32(float* x, int64_t n, float c) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] *= c;
  }
}
TRAINKIT_MULTIVERSION void scale_f64(double* x, int64_t n, double c) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] *= c;
  }
}

double sum_squares_any(const float* x, int64_t n) { return sum_squares_f32(x, n); }
double sum_squares_any(const double* x, int64_t n) { return sum_squares_f64(x, n); }
void scale_any(float* x, int64_t n, float c) { scale_f32(x, n, c); }
void scale_any(double* x, int64_t n, double c) { scale_f64(x, n, c); }

/// Σ|x|^p (or max |x| for p = inf) over one chunk, accumulated in double.
template <class T>
double chunk_reduce(const T* x, int64_t n, double p) {
  if (p == 2.0) {
    return sum_squares_any(x, n);
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

/// The total norm on the fused path: one parallel pass, partial results combined in a fixed order so
/// that the result does not depend on the thread count.
template <class T>
double fused_norm(const std::vector<at::Tensor>& grads, double p) {
  const auto chunks = chunks_of(grads, kGrain);
  std::vector<double> partial(chunks.size(), 0.0);
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      partial[static_cast<size_t>(c)] =
          chunk_reduce(static_cast<const T*>(chunks[static_cast<size_t>(c)].data), chunks[static_cast<size_t>(c)].n, p);
    }
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
  const auto chunks = chunks_of(grads, kGrain);
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      scale_any(static_cast<T*>(chunks[static_cast<size_t>(c)].data), chunks[static_cast<size_t>(c)].n, coef);
    }
  });
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
