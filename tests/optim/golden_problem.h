#pragma once
// The fixed float64 problem of scripts/golden_optim.py, shared by the optimizer golden tests.

#include <vector>

#include <torch/torch.h>

namespace trainkit::test {

/// The loss of scripts/golden_optim.py: Σ w(p - t)² + 0.3 Σ sin(2p), w and t linspaces in the parameter's shape.
inline at::Tensor golden_loss(const std::vector<at::Tensor>& params) {
  at::Tensor total = torch::zeros({}, torch::kFloat64);
  for (const auto& p : params) {
    const int64_t n = p.numel();
    const auto w = torch::linspace(0.5, 2.0, n, torch::kFloat64).view(p.sizes());
    const auto t = torch::linspace(-1.0, 1.0, n, torch::kFloat64).view(p.sizes());
    total = total + (w * (p - t).pow(2)).sum() + 0.3 * torch::sin(2 * p).sum();
  }
  return total;
}

}  // namespace trainkit::test
