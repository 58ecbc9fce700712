#pragma once
/// @file
/// Samplers propose the next points of a study in the unit cube of its SearchSpace: RandomSampler (the
/// baseline, uniform) and GPSampler (Bayesian optimization: a scrambled Sobol design, then a Gaussian process
/// and an acquisition function, with constant-liar batches). Samplers hold no state between calls: a call's
/// answer depends only on its arguments, so a study reloaded from a file continues exactly.

#include <cstdint>
#include <limits>
#include <vector>

#include <torch/arg.h>

#include "trainkit/tune/acquisition.h"
#include "trainkit/tune/gaussian_process.h"
#include "trainkit/tune/search_space.h"

namespace trainkit::tune {

/// A finished evaluation as a sampler sees it: unit-cube point and value to minimize (NaN: failed or pruned).
struct Observation {
  std::vector<double> u;
  double value = 0;
  /// Stopped by the pruner (value NaN): TPE ranks such points by how far they got and how well.
  bool pruned = false;
  /// Pruned: the last step reported, -1 when none.
  int64_t last_step = -1;
  /// Pruned: the value reported at last_step, to minimize (NaN when none or NaN).
  double last_value = std::numeric_limits<double>::quiet_NaN();
};

/// What proposes points. `suggest` returns `q` points (space.dims() coordinates in [0, 1] each, snapped to
/// what decode() evaluates) given the finished observations, the points still being evaluated (`pending`)
/// and the study's `seed`.
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual std::vector<std::vector<double>> suggest(const SearchSpace& space, const std::vector<Observation>& observed,
                                                   const std::vector<std::vector<double>>& pending, int64_t q,
                                                   uint64_t seed) = 0;
};

/// Uniform random points (Bergstra & Bengio 2012), each drawn from (seed, its index in the study).
class RandomSampler : public Sampler {
 public:
  std::vector<std::vector<double>> suggest(const SearchSpace& space, const std::vector<Observation>& observed,
                                           const std::vector<std::vector<double>>& pending, int64_t q,
                                           uint64_t seed) override;
};

/// Options of GPSampler: `GPSamplerOptions().n_startup_trials(8).acquisition(AcquisitionOptions().name("ucb"))`.
struct GPSamplerOptions {
  /// Points of the initial design (scrambled Sobol) before the Gaussian process takes over.
  TORCH_ARG(int64_t, n_startup_trials) = 10;
  /// The acquisition and its optimizer.
  TORCH_ARG(AcquisitionOptions, acquisition) = {};
  /// Bounds and restarts of the hyperparameter fit.
  TORCH_ARG(GaussianProcessOptions, gp) = {};
};

/// Bayesian optimization with a Gaussian-process surrogate (Snoek et al. 2012, arXiv 1206.2944): the first
/// `n_startup_trials` points are a Sobol sequence with a random digital shift from the seed; after that the GP
/// is fitted to the observations (failed ones imputed with the worst finite value, so that the model learns to
/// avoid them without a NaN in it) and each point maximizes the acquisition. For q > 1 points, and for points
/// still pending, the constant liar (Ginsbourger et al. 2010) adds them with the best value seen as a fake
/// observation, under the same hyperparameters, before choosing the next. Each call fits the hyperparameters
/// afresh from the defaults and random starts drawn from (seed, number of trials): no warm start from an
/// earlier call's fit (as Optuna's GPSampler keeps), so that a study reloaded from a file asks exactly what the
/// original would have. The model's work runs on one intra-op thread (at::set_num_threads(1) for the call,
/// restored after): its matrices are small.
class GPSampler : public Sampler {
 public:
  explicit GPSampler(GPSamplerOptions options = {});
  std::vector<std::vector<double>> suggest(const SearchSpace& space, const std::vector<Observation>& observed,
                                           const std::vector<std::vector<double>>& pending, int64_t q,
                                           uint64_t seed) override;
  const GPSamplerOptions& options() const { return options_; }

 private:
  GPSamplerOptions options_;
};

/// A 64-bit mix of a seed and an index (splitmix64), so that every call and point gets its own stream.
uint64_t mix_seed(uint64_t seed, uint64_t index);

}  // namespace trainkit::tune
