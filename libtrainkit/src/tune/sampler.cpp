#include "trainkit/tune/sampler.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/tune/sobol.h"

namespace trainkit::tune {

uint64_t mix_seed(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

namespace {

// Runs the sampler's small-matrix work on one intra-op thread and restores the setting after. The GP's
// matrices are at most a few hundred wide: extra threads only add synchronization, and on a loaded 2-core
// machine waiting threads made a suggestion 12x slower (measured: 41 s against 3.4 s for a test's study).
class OneThread {
 public:
  OneThread() : saved_(at::get_num_threads()) {
    if (saved_ != 1) at::set_num_threads(1);
  }
  ~OneThread() {
    if (saved_ != 1) at::set_num_threads(saved_);
  }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};

std::vector<double> uniform_point(const SearchSpace& space, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<double> u(static_cast<size_t>(space.dims()));
  for (auto& v : u) v = uni(rng);
  return space.snap(u);
}

bool same_point(const std::vector<double>& a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::abs(a[i] - b[i]) > 1e-9) return false;
  }
  return true;
}

}  // namespace

std::vector<std::vector<double>> RandomSampler::suggest(const SearchSpace& space, const std::vector<Observation>& observed,
                                                        const std::vector<std::vector<double>>& pending, int64_t q,
                                                        uint64_t seed) {
  std::vector<std::vector<double>> out;
  const uint64_t first = observed.size() + pending.size();
  for (int64_t i = 0; i < q; ++i) {
    std::mt19937_64 rng(mix_seed(seed, first + static_cast<uint64_t>(i)));
    out.push_back(uniform_point(space, rng));
  }
  return out;
}

GPSampler::GPSampler(GPSamplerOptions options) : options_(std::move(options)) {
  if (options_.n_startup_trials() < 0) {
    throw std::invalid_argument(fmt::format("GPSamplerOptions: n_startup_trials must be >= 0, got {}",
                                            options_.n_startup_trials()));
  }
  validate(options_.acquisition());
  GaussianProcess check(options_.gp());  // validates the GP options now rather than at the first fit
}

std::vector<std::vector<double>> GPSampler::suggest(const SearchSpace& space, const std::vector<Observation>& observed,
                                                    const std::vector<std::vector<double>>& pending, int64_t q,
                                                    uint64_t seed) {
  if (space.empty()) throw std::invalid_argument("GPSampler: the search space has no parameters");
  const int64_t d = space.dims();
  const uint64_t first = observed.size() + pending.size();
  std::vector<std::vector<double>> out;

  std::vector<double> finite;
  for (const auto& o : observed) {
    if (std::isfinite(o.value)) finite.push_back(o.value);
  }
  // The design phase, and the fallback while fewer than two finite values exist (nothing to model yet).
  const bool design = static_cast<int64_t>(first) < options_.n_startup_trials() || finite.size() < 2;
  if (design || d > Sobol::kMaxDims) {
    if (d <= Sobol::kMaxDims) {
      Sobol sobol(d, static_cast<int64_t>(seed & 0x7FFFFFFFFFFFFFFFULL));
      for (int64_t i = 0; i < q; ++i) out.push_back(space.snap(sobol.point(first + static_cast<uint64_t>(i))));
      return out;
    }
    if (design) {
      std::mt19937_64 rng(mix_seed(seed, first));
      for (int64_t i = 0; i < q; ++i) out.push_back(uniform_point(space, rng));
      return out;
    }
  }

  const OneThread one_thread;
  std::mt19937_64 rng(mix_seed(seed, first));
  const double worst = *std::max_element(finite.begin(), finite.end());
  const double best_value = *std::min_element(finite.begin(), finite.end());
  std::vector<double> xs, ys;
  std::vector<std::pair<double, size_t>> ranked;
  for (size_t i = 0; i < observed.size(); ++i) {
    const auto& o = observed[i];
    xs.insert(xs.end(), o.u.begin(), o.u.end());
    ys.push_back(std::isfinite(o.value) ? o.value : worst);
    if (std::isfinite(o.value)) ranked.emplace_back(o.value, i);
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::vector<double>> anchors;
  for (size_t i = 0; i < std::min<size_t>(5, ranked.size()); ++i) anchors.push_back(observed[ranked[i].second].u);

  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  GaussianProcess gp(options_.gp());
  gp.set_data(torch::tensor(xs, opts).view({-1, d}), torch::tensor(ys, opts));
  gp.fit(rng);
  const GPHyperparameters fitted = gp.hyperparameters();

  std::vector<std::vector<double>> taken = pending;  // points the next one should not repeat
  for (const auto& o : observed) taken.push_back(o.u);
  auto add_lies = [&](const std::vector<std::vector<double>>& lies) {
    if (lies.empty()) return;
    std::vector<double> lx = xs, ly = ys;
    for (const auto& p : lies) {
      lx.insert(lx.end(), p.begin(), p.end());
      ly.push_back(best_value);
    }
    gp.set_hyperparameters(fitted);
    gp.set_data(torch::tensor(lx, opts).view({-1, d}), torch::tensor(ly, opts));
  };
  std::vector<std::vector<double>> lies = pending;
  add_lies(lies);
  for (int64_t i = 0; i < q; ++i) {
    // The incumbent in the model's own (standardized) units.
    const double best = (best_value - gp.y_mean()) / gp.y_std();
    auto u = space.snap(maximize_acquisition(gp, best, options_.acquisition(), anchors, rng));
    const bool repeated = std::any_of(taken.begin(), taken.end(), [&](const auto& t) { return same_point(t, u); });
    if (repeated) u = uniform_point(space, rng);  // integer/categorical spaces can snap onto a seen point
    out.push_back(u);
    taken.push_back(u);
    lies.push_back(u);
    if (i + 1 < q) add_lies(lies);
  }
  return out;
}

}  // namespace trainkit::tune
