#pragma once
/// @file
/// The Tree-structured Parzen Estimator sampler (Bergstra et al. 2011, "Algorithms for Hyper-Parameter
/// Optimization"; Watanabe 2023, arXiv 2304.11127), with Optuna 5.1's TPESampler rules and defaults: the
/// observations split into the best gamma(n) = min(ceil(0.1 n), 25) ("below", l(x)) and the rest ("above",
/// g(x)); a Parzen estimator (a weighted mixture of truncated Gaussians, or of categorical distributions, plus a
/// prior kernel) over each; n_ei_candidates points drawn from l and the one with the largest log l(x) - log g(x)
/// proposed.
///
/// TPE works in Optuna's internal representation, not in the unit cube: a point's coordinates are decoded to
/// parameter values (SearchSpace::decode), a float is its value (its log for a log parameter), an integer its
/// value on a range widened by half a step each side (log(low - 0.5) .. log(high + 0.5) for a log integer),
/// a categorical its choice's index; the proposal is encoded back (SearchSpace::encode).

#include <cstdint>
#include <random>
#include <vector>

#include <torch/arg.h>

#include "trainkit/tune/sampler.h"
#include "trainkit/tune/search_space.h"

namespace trainkit::tune {

/// Options of a ParzenEstimator (Optuna's `_ParzenEstimatorParameters`, its defaults).
struct ParzenEstimatorOptions {
  /// Weight of the prior kernel (a Gaussian at the range's centre with the range's width as sigma, or the
  /// uniform distribution over the choices) against the observations' kernels.
  TORCH_ARG(double, prior_weight) = 1.0;
  /// Clip the smallest sigma to (high - low) / min(100, 1 + kernels) ("magic clip"); off: to 1e-12.
  TORCH_ARG(bool, consider_magic_clip) = true;
  /// The outermost kernels' sigmas reach to the range's ends; off (Optuna's default): to their one neighbour.
  TORCH_ARG(bool, consider_endpoints) = false;
};

/// A Parzen estimator over `params`: one kernel per observation plus the prior kernel, mixed with the
/// weights tpe_weights(n) then prior_weight, normalized. Per float or integer parameter a kernel is a Gaussian
/// truncated to the (log, widened) range at the observation with sigma the larger distance to its sorted
/// neighbours (the range's ends as outer neighbours); an integer's density is the Gaussian's mass on its cell.
/// Per categorical a kernel puts prior_weight / (n + 1) on every choice plus 1 on the observed one, normalized.
/// Observations and points are rows of internal values (the float, the integer, the choice's index).
class ParzenEstimator {
 public:
  ParzenEstimator(std::vector<Param> params, const std::vector<std::vector<double>>& observations,
                  ParzenEstimatorOptions options = {});
  /// `n` points drawn from the mixture: a kernel by weight, then each coordinate from that kernel (a truncated
  /// Gaussian's inverse CDF; an integer rounded to the nearest).
  std::vector<std::vector<double>> sample(std::mt19937_64& rng, int64_t n) const;
  /// log density of the mixture at `x` (for an integer, of its cell's mass; a log parameter's density is taken in
  /// log space, as Optuna's is).
  double log_pdf(const std::vector<double>& x) const;
  /// The kernels' normalized weights, the prior's last.
  const std::vector<double>& weights() const { return weights_; }

 private:
  struct Dim {
    bool categorical = false;
    bool log = false;
    bool discrete = false;
    double low = 0, high = 0;          // the parameter's own bounds (internal values)
    double lo = 0, hi = 0;             // the kernels' range: widened by half a step, in log space for log
    std::vector<double> mu, sigma;     // numerical: per kernel
    std::vector<std::vector<double>> probs;  // categorical: per kernel, per choice
  };
  std::vector<Dim> dims_;
  std::vector<double> weights_;
};

/// Optuna's default_gamma: how many observations make l(x), min(ceil(0.1 n), 25).
int64_t tpe_gamma(int64_t n);
/// Optuna's default_weights: n ones for n < 25, else a ramp from 1/n to 1 over the oldest n - 25 then 25 ones.
std::vector<double> tpe_weights(int64_t n);

/// Which observations make l(x) and g(x), by Optuna's `_split_trials` for one minimized objective: of
/// `observed` (in trial order), the completed ones (finite value) by value, then the pruned ones by their
/// last reported step (the furthest first) and its value, fill the `n_below` places of "below"; the others
/// that completed or were pruned are "above". Failed observations are in neither. Indices in trial order.
struct TPESplit {
  std::vector<size_t> below;
  std::vector<size_t> above;
};
TPESplit tpe_split(const std::vector<Observation>& observed, int64_t n_below);

/// Options of TPESampler (Optuna 5.1's names and defaults):
/// `TPESamplerOptions().n_startup_trials(20).multivariate(false)`.
struct TPESamplerOptions {
  /// Random points (RandomSampler's) until this many trials completed or were pruned.
  TORCH_ARG(int64_t, n_startup_trials) = 10;
  /// Points drawn from l(x) per proposal; the best of them by log l(x) - log g(x) is proposed.
  TORCH_ARG(int64_t, n_ei_candidates) = 24;
  /// One estimator over all parameters (Optuna 5.1's default for one objective); off: one per parameter,
  /// each proposed on its own (the "independent" TPE of Optuna 4 and earlier).
  TORCH_ARG(bool, multivariate) = true;
  /// Pending points (still being evaluated, and the earlier points of a batch) count as observations of g(x)
  /// (Optuna's constant_liar, on by default since 5.0): parallel workers spread out.
  TORCH_ARG(bool, constant_liar) = true;
  /// The Parzen estimators' prior weight, magic clip and endpoints.
  TORCH_ARG(ParzenEstimatorOptions, parzen) = {};
};

/// What TPE computes for fixed candidates: the split, log l(x) and log g(x) at each candidate (rows of internal
/// values over the space's parameters, in order) and the index of the winner (the first largest l - g).
struct TPEScores {
  TPESplit split;
  std::vector<double> log_l;
  std::vector<double> log_g;
  size_t best = 0;
};
/// The multivariate TPE's scores of `candidates` for `observed` (and, with constant_liar, `pending` as above).
TPEScores tpe_scores(const SearchSpace& space, const std::vector<Observation>& observed,
                     const std::vector<std::vector<double>>& pending, const std::vector<std::vector<double>>& candidates,
                     const TPESamplerOptions& options = {});

/// TPE (Optuna's TPESampler). Each proposal draws from (seed, its index in the study): reproducible, and, as
/// every sampler here, with no state between calls. Differences from Optuna: the random draws are trainkit's
/// own (std::mt19937_64), not numpy's RandomState, so the points differ while the rules are the same; the pending
/// points join g(x) after the finished observations rather than in trial order (this only changes the ramp of
/// the weights when g has more than 25 observations); sorting observations with equal values is stable.
class TPESampler : public Sampler {
 public:
  explicit TPESampler(TPESamplerOptions options = {});
  std::vector<std::vector<double>> suggest(const SearchSpace& space, const std::vector<Observation>& observed,
                                           const std::vector<std::vector<double>>& pending, int64_t q,
                                           uint64_t seed) override;
  const TPESamplerOptions& options() const { return options_; }

 private:
  TPESamplerOptions options_;
};

}  // namespace trainkit::tune
