#pragma once
/// @file
/// Acquisition functions of the Bayesian search, for minimization, on a posterior mean μ and standard
/// deviation σ and the best (smallest) value seen f*, with z = (f* − μ) / σ:
///   EI = σ (φ(z) + z Φ(z)) (Jones et al. 1998); log-EI = log σ + log h(z), h(z) = φ(z) + z Φ(z), evaluated
///   without underflow for very negative z (Ament et al. 2023, "Unexpected improvements to expected
///   improvement", arXiv 2310.20708, eq. 9); PI = Φ(z) (Kushner 1964); UCB = −μ + √β σ (Srinivas et al. 2010,
///   here the lower confidence bound of a minimization, negated so that larger is better).
/// All are differentiable tensors (float64); acquisition_at is the same functions on one point in plain double
/// precision with their derivatives, and maximize_acquisition finds a maximizer in the unit cube by
/// multi-start projected gradient ascent on that path (all starts in one batch, no autograd).

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "trainkit/tune/gaussian_process.h"

namespace trainkit::tune {

/// log h(z), h(z) = φ(z) + z Φ(z), stable for every finite z (for z → −∞, log h ≈ −z²/2 − log √(2π) − 2 log |z|).
at::Tensor log_h(const at::Tensor& z);
/// Expected improvement below `best`: σ h((best − μ)/σ).
at::Tensor expected_improvement(const at::Tensor& mean, const at::Tensor& sigma, double best);
/// log of expected_improvement, without underflow: log σ + log_h((best − μ)/σ).
at::Tensor log_expected_improvement(const at::Tensor& mean, const at::Tensor& sigma, double best);
/// Probability of improvement Φ((best − μ)/σ).
at::Tensor probability_of_improvement(const at::Tensor& mean, const at::Tensor& sigma, double best);
/// Upper confidence bound of −f: −μ + √β σ.
at::Tensor upper_confidence_bound(const at::Tensor& mean, const at::Tensor& sigma, double beta);

/// Which acquisition to maximize and how: `AcquisitionOptions().name("ucb").beta(4.0)`.
struct AcquisitionOptions {
  /// "log_ei", "ei", "ucb" or "pi".
  TORCH_ARG(std::string, name) = "log_ei";
  /// UCB's β (> 0).
  TORCH_ARG(double, beta) = 2.0;
  /// Random points (plus perturbations of the anchors) scored before the ascent.
  TORCH_ARG(int64_t, raw_samples) = 512;
  /// The best-scored of those that the ascent starts from.
  TORCH_ARG(int64_t, num_restarts) = 8;
  /// Adam steps of the ascent (each projected back into [0, 1]).
  TORCH_ARG(int64_t, steps) = 100;
  /// Adam's first learning rate, in unit-cube coordinates (decaying linearly to 0 over the steps).
  TORCH_ARG(double, lr) = 0.02;
};

/// An acquisition's value at one point and its partial derivatives in the posterior mean and variance.
struct AcquisitionAt {
  double value = 0;   ///< the acquisition
  double d_mean = 0;  ///< ∂value/∂μ
  double d_var = 0;   ///< ∂value/∂σ²
};

/// The acquisition `options.name()` from the posterior mean `mean` and latent variance `var` (> 0; standardized
/// units, as GaussianProcess::posterior gives them) and `best`: acquisition_value on one point, in double
/// precision with its derivatives (log-EI's derivative of log h is Φ(z)/h(z), evaluated in the same three
/// ranges as log_h). Throws std::invalid_argument for an unknown name.
AcquisitionAt acquisition_at(double mean, double var, double best, const AcquisitionOptions& options);

/// Checks `options` (std::invalid_argument naming the field and the value).
void validate(const AcquisitionOptions& options);

/// The acquisition `options.name()` at `xq` (m × d) under the model `gp`; `best` is the best standardized
/// output (as GaussianProcess::predict_standardized). Differentiable in `xq`.
at::Tensor acquisition_value(const GaussianProcess& gp, const at::Tensor& xq, double best,
                             const AcquisitionOptions& options);

/// A maximizer of the acquisition in [0, 1]^d: scores `raw_samples` uniform points and Gaussian perturbations
/// (σ = 0.05) of `anchors` (e.g. the best points seen), then runs projected Adam (torch::optim::Adam's update,
/// step size decaying linearly to 0) from the `num_restarts` best (ties: the first drawn), all starts as one
/// batch through GaussianProcess::posterior and acquisition_at; returns the best point found, never worse
/// than the best scored start.
std::vector<double> maximize_acquisition(const GaussianProcess& gp, double best, const AcquisitionOptions& options,
                                         const std::vector<std::vector<double>>& anchors, std::mt19937_64& rng);

}  // namespace trainkit::tune
