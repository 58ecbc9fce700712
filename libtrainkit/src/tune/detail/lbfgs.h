#pragma once
// L-BFGS with a strong-Wolfe line search on a plain vector of doubles: PyTorch's torch.optim.LBFGS
// (line_search_fn="strong_wolfe", one step() call) without tensors, for the GP's hyperparameter fit, whose
// objective is a hand-written double-precision function of a dozen numbers.
#include <cstdint>
#include <functional>
#include <vector>

namespace trainkit::tune::detail {

// torch.optim.LBFGS's options and defaults (max_eval = max_iter * 5 / 4 when 0).
struct LbfgsOptions {
  double lr = 1;
  int64_t max_iter = 20;
  int64_t max_eval = 0;
  double tolerance_grad = 1e-7;
  double tolerance_change = 1e-9;
  int64_t history_size = 100;
};

// The objective at x: returns false when it cannot be evaluated there (the minimization then stops and
// fails); otherwise writes f(x) and ∇f(x) (g has x's size).
using LbfgsObjective = std::function<bool(const std::vector<double>& x, double& f, std::vector<double>& g)>;

struct LbfgsResult {
  std::vector<double> x;  // the last iterate
  double f = 0;           // the objective there
  bool ok = false;        // false: the objective could not be evaluated somewhere on the way
  int64_t evaluations = 0;
  int64_t iterations = 0;
};

// Minimizes `f` from `x0` as one torch.optim.LBFGS step() does.
LbfgsResult lbfgs_minimize(const LbfgsObjective& f, std::vector<double> x0, const LbfgsOptions& options);

}  // namespace trainkit::tune::detail
