// The total gradient norm shared by gradient clipping (grad) and LAMB's global clip (optim).
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include <torch/torch.h>

#include "detail/parallel.h"

namespace trainkit::detail {
namespace {

/// Σ|x|^p (or max |x| for p = inf) over one chunk, accumulated in double.
template <class T>
double chunk_reduce(const T* x, int64_t n, double p) {
  if (p == 2.0) {
    return sum_squares(x, n);
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

/// The total norm on the fused path: one parallel pass, partials combined in chunk order.
template <class T>
double fused_norm(const std::vector<at::Tensor>& grads, double p) {
  const auto partial = reduce_chunks<1>(make_chunks(numels_of(grads)), [&](const Chunk& c, std::array<double, 1>& r) {
    r[0] = chunk_reduce(grads[static_cast<size_t>(c.tensor)].data_ptr<T>() + c.begin, c.n, p);
  });
  if (std::isinf(p)) {
    double m = 0;
    for (const auto& v : partial) {
      m = (v[0] > m || std::isnan(v[0])) ? v[0] : m;
    }
    return m;
  }
  double s = 0;
  for (const auto& v : partial) {
    s += v[0];
  }
  return p == 2.0 ? std::sqrt(s) : (p == 1.0 ? s : std::pow(s, 1.0 / p));
}

}  // namespace

at::Tensor total_norm(const std::vector<at::Tensor>& grads, double p) {
  if (grads.empty()) {
    return torch::zeros({});
  }
  const auto& first = grads.front();
  if (fusable(grads, nullptr)) {
    const double n = first.scalar_type() == at::kFloat ? fused_norm<float>(grads, p) : fused_norm<double>(grads, p);
    return torch::tensor(n, first.options().dtype(first.scalar_type()));
  }
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

}  // namespace trainkit::detail
