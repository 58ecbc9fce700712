#pragma once
/// @file
/// The Gaussian-process surrogate of the Bayesian search: a Matérn-5/2 kernel with one lengthscale per input
/// (automatic relevance determination), a signal variance, a constant mean and a noise variance, on inputs in
/// the unit cube and outputs standardized to mean 0 and standard deviation 1 (Rasmussen & Williams 2006,
/// "Gaussian Processes for Machine Learning", ch. 2 and 5). Hyperparameters are fitted by maximizing the log
/// marginal likelihood with L-BFGS from several starts, each hyperparameter inside bounds.
///
/// The model's own work (kernel matrices, Cholesky factorization, the likelihood's analytic gradient, the
/// L-BFGS fit, batched posteriors) is hand-written double-precision loops: on matrices a few dozen wide a
/// LibTorch op costs more in dispatch than in arithmetic. The tensor functions (predict_standardized,
/// matern52) remain for callers that want autograd.

#include <cstdint>
#include <random>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

namespace trainkit::tune {

/// Hyperparameters of a GaussianProcess, in the standardized output space.
struct GPHyperparameters {
  std::vector<double> lengthscales;  ///< ARD lengthscales ℓ_i, one per input dimension
  double outputscale = 1.0;          ///< signal variance s²
  double noise = 1e-4;               ///< noise variance σ_n²
  double mean = 0.0;                 ///< constant mean m
};

/// Bounds and effort of the hyperparameter fit: `GaussianProcessOptions().restarts(8)`.
struct GaussianProcessOptions {
  /// Smallest lengthscale (inputs live in [0, 1]).
  TORCH_ARG(double, lengthscale_min) = 0.01;
  /// Largest lengthscale (a dimension with this lengthscale hardly matters).
  TORCH_ARG(double, lengthscale_max) = 20.0;
  /// Smallest signal variance.
  TORCH_ARG(double, outputscale_min) = 0.01;
  /// Largest signal variance.
  TORCH_ARG(double, outputscale_max) = 20.0;
  /// Smallest noise variance.
  TORCH_ARG(double, noise_min) = 1e-6;
  /// Largest noise variance.
  TORCH_ARG(double, noise_max) = 1.0;
  /// Bound of |constant mean| (standardized outputs).
  TORCH_ARG(double, mean_bound) = 3.0;
  /// Starts of the L-BFGS fit: the previous optimum (when there is one), a default, then random points; a start
  /// equal to an earlier one (a fresh model's previous optimum is the default) is not run twice.
  TORCH_ARG(int64_t, restarts) = 4;
  /// L-BFGS iterations per start (PyTorch's LBFGS: strong-Wolfe line search, at most 5/4 as many
  /// likelihood evaluations).
  TORCH_ARG(int64_t, max_iter) = 60;
  /// Largest jitter, relative to the mean diagonal, added to the covariance before the Cholesky
  /// factorization is declared failed (tried: 0, then 1e-10, 1e-9, ... up to this).
  TORCH_ARG(double, max_jitter) = 1e-4;
};

/// A Gaussian-process regression model, float64 throughout.
///
/// k(x, x') = s² (1 + √5 r + 5/3 r²) exp(−√5 r), r² = Σ_i (x_i − x'_i)² / ℓ_i² (Matérn ν = 5/2);
/// y ~ N(m, K + σ_n² I) for the standardized outputs ỹ = (y − ȳ) / sd(y) (sd with divisor n, 1 when 0).
/// Posterior at x*: μ = m + k*ᵀ (K + σ_n² I)⁻¹ (ỹ − m), σ² = s² − k*ᵀ (K + σ_n² I)⁻¹ k*;
/// log marginal likelihood −½ (ỹ − m)ᵀ (K + σ_n² I)⁻¹ (ỹ − m) − ½ log|K + σ_n² I| − n/2 log 2π.
/// With m = 0 these equal scikit-learn's GaussianProcessRegressor(Matern(nu=2.5) * ConstantKernel +
/// WhiteKernel, normalize_y=True, alpha=0) (tested to 1e-8).
class GaussianProcess {
 public:
  explicit GaussianProcess(GaussianProcessOptions options = {});

  /// Sets the training data: `x` (n × d, in [0, 1]) and `y` (n, finite); n ≥ 1. Keeps hyperparameters
  /// whose lengthscales match d (else resets them to defaults) and refactorizes.
  void set_data(const at::Tensor& x, const at::Tensor& y);
  /// Sets the hyperparameters (lengthscales must match d, all positive) and refactorizes.
  void set_hyperparameters(GPHyperparameters h);
  /// Maximizes the log marginal likelihood over the hyperparameters within the options' bounds, from
  /// `restarts` starts drawn from `rng`; keeps the best and returns its log marginal likelihood.
  double fit(std::mt19937_64& rng);

  const GPHyperparameters& hyperparameters() const { return h_; }
  /// Log marginal likelihood of the standardized outputs under the current hyperparameters.
  double log_marginal_likelihood() const { return lml_; }
  /// Its gradient in (log ℓ_1 … log ℓ_d, log s², log σ_n², m), d + 3 numbers:
  /// ½ tr((ααᵀ − (K + σ_n² I)⁻¹) ∂K/∂θ) for the kernel's parameters (Rasmussen & Williams eq. 5.9) and Σ α_i
  /// for the mean, α = (K + σ_n² I)⁻¹ (ỹ − m); any jitter of the factorization counts as part of K.
  std::vector<double> log_marginal_likelihood_gradient() const;
  /// Jitter (absolute) that the last factorization needed; 0 when none.
  double jitter() const { return jitter_; }
  int64_t dims() const { return d_; }
  int64_t size() const { return n_; }
  /// ȳ and sd(y) of the standardization.
  double y_mean() const { return y_mean_; }
  double y_std() const { return y_std_; }

  /// Posterior mean and variance at `xq` (m × d), standardized units; differentiable in `xq`.
  /// `with_noise` adds σ_n² to the variance (the predictive variance of a new observation).
  std::pair<at::Tensor, at::Tensor> predict_standardized(const at::Tensor& xq, bool with_noise = false) const;
  /// Posterior mean and variance in the units of y.
  std::pair<at::Tensor, at::Tensor> predict(const at::Tensor& xq, bool with_noise = false) const;
  /// predict_standardized's mean and latent variance (clamped at 1e-30 likewise) at the `m` rows of `xq`
  /// (row-major m × d), written to `mean` and `var` (m each), in plain double precision for the acquisition
  /// optimizer: all rows in one pass over the Cholesky factor. With `grad_mean` and `grad_var` (m × d each),
  /// also their gradients in xq (0 for the variance where it is clamped).
  void posterior(const double* xq, int64_t m, double* mean, double* var, double* grad_mean = nullptr,
                 double* grad_var = nullptr) const;

  /// The Matérn-5/2 cross-covariance s² k(a_i, b_j) (a: n × d, b: m × d); differentiable.
  static at::Tensor matern52(const at::Tensor& a, const at::Tensor& b, const at::Tensor& lengthscales,
                             const at::Tensor& outputscale);

 private:
  void factorize();
  GaussianProcessOptions options_;
  GPHyperparameters h_;
  int64_t n_ = 0, d_ = 0;
  std::vector<double> x_, y_;       // inputs (row-major n × d), standardized outputs
  std::vector<double> chol_, alpha_;  // L (row-major, lower) of K + σ_n² I (+ jitter), (K + σ_n² I)⁻¹ (ỹ − m)
  double y_mean_ = 0, y_std_ = 1, lml_ = 0, jitter_ = 0;
};

/// The Cholesky factor of a symmetric positive-definite `k`, adding jitter · mean(diag) · I when needed
/// (0, then 1e-10 up to `max_jitter` by factors of 10). Returns the factor and writes the absolute jitter
/// used; throws std::runtime_error naming the size and the largest jitter tried when all fail.
at::Tensor cholesky_with_jitter(const at::Tensor& k, double max_jitter, double* jitter_used = nullptr);

}  // namespace trainkit::tune
