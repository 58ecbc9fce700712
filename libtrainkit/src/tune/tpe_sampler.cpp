#include "trainkit/tune/tpe_sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

#include "trainkit/tune/optuna_journal.h"

namespace trainkit::tune {
namespace {

constexpr double kEps = 1e-12;
const double kSqrt2 = std::sqrt(2.0);
const double kHalfLog2Pi = 0.5 * std::log(2 * M_PI);

// ---- The truncated Gaussian's numerics, as Optuna's samplers/_tpe/_truncnorm.py computes them.

double ndtr(double a) {
  const double x = a / kSqrt2;
  if (x < -1 / kSqrt2) return 0.5 * std::erfc(-x);
  if (x < 1 / kSqrt2) return 0.5 + 0.5 * std::erf(x);
  return 1.0 - 0.5 * std::erfc(x);
}

double log_ndtr(double a) {
  if (a > 6) return -ndtr(-a);
  if (a > -20) return std::log(ndtr(a));
  // The asymptotic series of the far left tail.
  const double log_lhs = -0.5 * a * a - std::log(-a) - kHalfLog2Pi;
  double last_total = 0, rhs = 1, numerator = 1, denom_factor = 1;
  const double denom_cons = 1 / (a * a);
  int sign = 1;
  for (int i = 1; std::abs(last_total - rhs) > DBL_EPSILON; ++i) {
    last_total = rhs;
    sign = -sign;
    denom_factor *= denom_cons;
    numerator *= 2 * i - 1;
    rhs += sign * numerator * denom_factor;
  }
  return log_lhs + std::log(rhs);
}

double log_diff(double log_p, double log_q) { return log_p + std::log1p(-std::exp(log_q - log_p)); }

double log_add(double a, double b) {
  const double m = std::max(a, b);
  if (std::isinf(m) && m < 0) return m;
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

// log of the standard Gaussian's mass on [a, b], worked in the left tail for accuracy.
double log_gauss_mass(double a, double b) {
  if (b <= 0) return log_diff(log_ndtr(b), log_ndtr(a));
  if (a > 0) return log_diff(log_ndtr(-a), log_ndtr(-b));
  return std::log1p(-(0.5 + 0.5 * std::erf(a / kSqrt2)) - (0.5 + 0.5 * std::erf(-b / kSqrt2)));
}

// x with log_ndtr(x) = y, by Newton's method from a tail or logistic first guess.
double ndtri_exp(double y) {
  const bool flipped = y > -1e-2;
  const double z = flipped ? std::log(-std::expm1(y)) : y;
  double x = z < -5 ? -std::sqrt(-2.0 * (z + kHalfLog2Pi)) : -std::sqrt(3.0) / M_PI * std::log(std::expm1(-z));
  for (int i = 0; i < 100; ++i) {
    const double log_ndtr_x = log_ndtr(x);
    const double log_pdf_x = -0.5 * x * x - kHalfLog2Pi;
    const double dx = (log_ndtr_x - z) * std::exp(log_ndtr_x - log_pdf_x);
    x -= dx;
    if (std::abs(dx) < 1e-8 * std::abs(x)) break;
  }
  return flipped ? -x : x;
}

// The inverse CDF at q of the standard Gaussian truncated to [a, b].
double truncnorm_ppf(double q, double a, double b) {
  if (q <= 0) return a;
  if (q >= 1) return b;
  const double log_mass = log_gauss_mass(a, b);
  if (a < 0) return ndtri_exp(log_add(log_ndtr(a), std::log(q) + log_mass));
  return -ndtri_exp(log_add(log_ndtr(-b), std::log1p(-q) + log_mass));
}

double truncnorm_logpdf(double x, double lo, double hi, double mu, double sigma) {
  if (x < lo || x > hi) return -std::numeric_limits<double>::infinity();
  const double z = (x - mu) / sigma;
  return -z * z / 2 - kHalfLog2Pi - log_gauss_mass((lo - mu) / sigma, (hi - mu) / sigma) - std::log(sigma);
}

// ---- Internal representation.

bool single(const Param& p) { return p.kind == Param::Kind::Categorical && p.choices.size() == 1; }

std::vector<double> internal_row(const SearchSpace& space, const std::vector<double>& u,
                                 const std::vector<size_t>& which) {
  const ParamSet point = space.decode(u);
  std::vector<double> row;
  for (size_t i : which) {
    const Param& p = space.params()[i];
    row.push_back(optuna_internal(p, point.at(p.name)));
  }
  return row;
}

ParamValue external(const Param& p, double v) {
  switch (p.kind) {
    case Param::Kind::Float: return std::clamp(v, p.low, p.high);
    case Param::Kind::Int: return static_cast<int64_t>(std::clamp(std::nearbyint(v), p.low, p.high));
    case Param::Kind::Categorical: return p.choices.at(static_cast<size_t>(v));
  }
  return v;
}

size_t argmax_first(const std::vector<double>& v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i] > v[best] || (std::isnan(v[best]) && !std::isnan(v[i]))) best = i;
  }
  return best;
}

/// l(x) and g(x) over the parameters `which` of the space.
struct TPEModel {
  ParzenEstimator below;
  ParzenEstimator above;
};

TPEModel build_model(const SearchSpace& space, const std::vector<size_t>& which, const std::vector<Observation>& observed,
                     const std::vector<std::vector<double>>& pending, const TPESplit& split,
                     const TPESamplerOptions& options) {
  std::vector<Param> params;
  for (size_t i : which) params.push_back(space.params()[i]);
  std::vector<std::vector<double>> below, above;
  for (size_t i : split.below) below.push_back(internal_row(space, observed[i].u, which));
  for (size_t i : split.above) above.push_back(internal_row(space, observed[i].u, which));
  if (options.constant_liar()) {
    for (const auto& u : pending) above.push_back(internal_row(space, u, which));
  }
  return {ParzenEstimator(params, below, options.parzen()), ParzenEstimator(params, above, options.parzen())};
}

int64_t finished_count(const std::vector<Observation>& observed) {
  return std::count_if(observed.begin(), observed.end(),
                       [](const Observation& o) { return o.pruned || std::isfinite(o.value); });
}

}  // namespace

// ---- ParzenEstimator

ParzenEstimator::ParzenEstimator(std::vector<Param> params, const std::vector<std::vector<double>>& observations,
                                 ParzenEstimatorOptions options) {
  if (!(options.prior_weight() >= 0)) {
    throw std::invalid_argument(fmt::format("ParzenEstimatorOptions: prior_weight must be >= 0, got {}",
                                            options.prior_weight()));
  }
  const size_t n = observations.size();
  for (const auto& row : observations) {
    if (row.size() != params.size()) {
      throw std::invalid_argument(fmt::format("ParzenEstimator: an observation of {} values for {} parameters",
                                              row.size(), params.size()));
    }
  }
  if (n == 0) {
    weights_ = {1.0};
  } else {
    weights_ = tpe_weights(static_cast<int64_t>(n));
    weights_.push_back(options.prior_weight());
    const double sum = std::accumulate(weights_.begin(), weights_.end(), 0.0);
    for (auto& w : weights_) w /= sum;
  }
  for (size_t j = 0; j < params.size(); ++j) {
    const Param& p = params[j];
    Dim d;
    if (p.kind == Param::Kind::Categorical) {
      d.categorical = true;
      const size_t c = p.choices.size();
      if (n == 0) {
        d.probs.assign(1, std::vector<double>(c, 1.0 / static_cast<double>(c)));
      } else {
        const double fill = options.prior_weight() / static_cast<double>(n + 1);
        d.probs.assign(n + 1, std::vector<double>(c, fill));
        for (size_t k = 0; k < n; ++k) d.probs[k][static_cast<size_t>(observations[k][j])] += 1;
        for (auto& row : d.probs) {
          const double sum = std::accumulate(row.begin(), row.end(), 0.0);
          for (auto& v : row) v /= sum == 0 ? 1 : sum;
        }
      }
      dims_.push_back(std::move(d));
      continue;
    }
    d.log = p.log;
    d.discrete = p.kind == Param::Kind::Int;
    d.low = p.low;
    d.high = p.high;
    d.lo = d.discrete ? p.low - 0.5 : p.low;
    d.hi = d.discrete ? p.high + 0.5 : p.high;
    if (d.log) {
      d.lo = std::log(d.lo);
      d.hi = std::log(d.hi);
    }
    std::vector<double> mus(n);
    for (size_t k = 0; k < n; ++k) mus[k] = d.log ? std::log(observations[k][j]) : observations[k][j];
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return mus[a] < mus[b]; });
    std::vector<double> ends(n + 2);
    ends[0] = d.lo;
    for (size_t k = 0; k < n; ++k) ends[k + 1] = mus[order[k]];
    ends[n + 1] = d.hi;
    std::vector<double> sorted_sigma(n);
    for (size_t k = 0; k < n; ++k) sorted_sigma[k] = std::max(ends[k + 1] - ends[k], ends[k + 2] - ends[k + 1]);
    if (!options.consider_endpoints() && n >= 2) {
      sorted_sigma[0] = ends[2] - ends[1];
      sorted_sigma[n - 1] = ends[n] - ends[n - 1];
    }
    const double max_sigma = d.hi - d.lo;
    const double min_sigma =
        options.consider_magic_clip() ? (d.hi - d.lo) / std::min(100.0, 1.0 + static_cast<double>(n + 1)) : kEps;
    d.mu = mus;
    d.sigma.resize(n);
    for (size_t k = 0; k < n; ++k) d.sigma[order[k]] = std::clamp(sorted_sigma[k], min_sigma, max_sigma);
    d.mu.push_back(0.5 * (d.lo + d.hi));
    d.sigma.push_back(d.hi - d.lo);
    dims_.push_back(std::move(d));
  }
}

std::vector<std::vector<double>> ParzenEstimator::sample(std::mt19937_64& rng, int64_t n) const {
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::discrete_distribution<size_t> kernel(weights_.begin(), weights_.end());
  std::vector<std::vector<double>> out;
  for (int64_t s = 0; s < n; ++s) {
    const size_t k = kernel(rng);
    std::vector<double> x;
    for (const Dim& d : dims_) {
      const double q = uni(rng);
      if (d.categorical) {
        const auto& row = d.probs[k];
        double cum = 0;
        size_t c = 0;
        while (c + 1 < row.size() && (cum += row[c]) < q) ++c;
        x.push_back(static_cast<double>(c));
        continue;
      }
      const double mu = d.mu[k], sigma = d.sigma[k];
      double v = truncnorm_ppf(q, (d.lo - mu) / sigma, (d.hi - mu) / sigma) * sigma + mu;
      if (d.log) v = std::exp(v);
      if (d.discrete) v = std::clamp(d.low + std::nearbyint(v - d.low), d.low, d.high);
      else v = std::clamp(v, d.low, d.high);
      x.push_back(v);
    }
    out.push_back(std::move(x));
  }
  return out;
}

double ParzenEstimator::log_pdf(const std::vector<double>& x) const {
  if (x.size() != dims_.size()) {
    throw std::invalid_argument(fmt::format("ParzenEstimator::log_pdf: {} values for {} parameters", x.size(),
                                            dims_.size()));
  }
  const size_t kernels = weights_.size();
  std::vector<double> per_kernel(kernels);
  for (size_t k = 0; k < kernels; ++k) per_kernel[k] = std::log(weights_[k]);
  for (size_t j = 0; j < dims_.size(); ++j) {
    const Dim& d = dims_[j];
    for (size_t k = 0; k < kernels; ++k) {
      if (d.categorical) {
        per_kernel[k] += std::log(d.probs[k][static_cast<size_t>(x[j])]);
      } else if (d.discrete) {
        const double left = d.log ? std::log(x[j] - 0.5) : x[j] - 0.5;
        const double right = d.log ? std::log(x[j] + 0.5) : x[j] + 0.5;
        const double mu = d.mu[k], sigma = d.sigma[k];
        per_kernel[k] += log_gauss_mass((left - mu) / sigma, (right - mu) / sigma) -
                         log_gauss_mass((d.lo - mu) / sigma, (d.hi - mu) / sigma);
      } else {
        per_kernel[k] += truncnorm_logpdf(d.log ? std::log(x[j]) : x[j], d.lo, d.hi, d.mu[k], d.sigma[k]);
      }
    }
  }
  double m = *std::max_element(per_kernel.begin(), per_kernel.end());
  if (std::isinf(m) && m < 0) m = 0;  // every kernel gives 0: log(0), not NaN
  double sum = 0;
  for (double v : per_kernel) sum += std::exp(v - m);
  return std::log(sum) + m;
}

// ---- The split, gamma and weights.

int64_t tpe_gamma(int64_t n) { return std::min<int64_t>(static_cast<int64_t>(std::ceil(0.1 * static_cast<double>(n))), 25); }

std::vector<double> tpe_weights(int64_t n) {
  if (n <= 0) return {};
  if (n < 25) return std::vector<double>(static_cast<size_t>(n), 1.0);
  std::vector<double> w;
  const int64_t ramp = n - 25;
  const double start = 1.0 / static_cast<double>(n);
  // numpy.linspace(1/n, 1, n - 25): start + i * step, the last one exactly 1.
  const double step = ramp > 1 ? (1.0 - start) / static_cast<double>(ramp - 1) : 0.0;
  for (int64_t i = 0; i < ramp; ++i) w.push_back(i + 1 == ramp && ramp > 1 ? 1.0 : start + static_cast<double>(i) * step);
  w.insert(w.end(), 25, 1.0);
  return w;
}

TPESplit tpe_split(const std::vector<Observation>& observed, int64_t n_below) {
  std::vector<size_t> complete, pruned;
  for (size_t i = 0; i < observed.size(); ++i) {
    if (observed[i].pruned) pruned.push_back(i);
    else if (std::isfinite(observed[i].value)) complete.push_back(i);
  }
  std::stable_sort(complete.begin(), complete.end(),
                   [&](size_t a, size_t b) { return observed[a].value < observed[b].value; });
  // Optuna's _get_pruned_trial_score: (-last step, its value; NaN last), and (1, 0) without a report.
  const auto score = [&](size_t i) {
    const Observation& o = observed[i];
    if (o.last_step < 0) return std::make_tuple(1.0, 0.0);
    return std::make_tuple(-static_cast<double>(o.last_step),
                           std::isnan(o.last_value) ? std::numeric_limits<double>::infinity() : o.last_value);
  };
  std::stable_sort(pruned.begin(), pruned.end(), [&](size_t a, size_t b) { return score(a) < score(b); });
  TPESplit split;
  int64_t left = std::max<int64_t>(n_below, 0);
  for (const auto* group : {&complete, &pruned}) {
    const auto take = static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(group->size())));
    split.below.insert(split.below.end(), group->begin(), group->begin() + static_cast<std::ptrdiff_t>(take));
    split.above.insert(split.above.end(), group->begin() + static_cast<std::ptrdiff_t>(take), group->end());
    left -= static_cast<int64_t>(take);
  }
  std::sort(split.below.begin(), split.below.end());
  std::sort(split.above.begin(), split.above.end());
  return split;
}

TPEScores tpe_scores(const SearchSpace& space, const std::vector<Observation>& observed,
                     const std::vector<std::vector<double>>& pending, const std::vector<std::vector<double>>& candidates,
                     const TPESamplerOptions& options) {
  std::vector<size_t> all(space.params().size());
  std::iota(all.begin(), all.end(), 0);
  TPEScores scores;
  scores.split = tpe_split(observed, tpe_gamma(finished_count(observed)));
  const TPEModel model = build_model(space, all, observed, pending, scores.split, options);
  std::vector<double> acq;
  for (const auto& x : candidates) {
    scores.log_l.push_back(model.below.log_pdf(x));
    scores.log_g.push_back(model.above.log_pdf(x));
    acq.push_back(scores.log_l.back() - scores.log_g.back());
  }
  scores.best = argmax_first(acq);
  return scores;
}

// ---- The sampler.

TPESampler::TPESampler(TPESamplerOptions options) : options_(options) {
  if (options_.n_startup_trials() < 0) {
    throw std::invalid_argument(fmt::format("TPESamplerOptions: n_startup_trials must be >= 0, got {}",
                                            options_.n_startup_trials()));
  }
  if (options_.n_ei_candidates() < 1) {
    throw std::invalid_argument(fmt::format("TPESamplerOptions: n_ei_candidates must be >= 1, got {}",
                                            options_.n_ei_candidates()));
  }
  if (!(options_.parzen().prior_weight() >= 0)) {
    throw std::invalid_argument(fmt::format("TPESamplerOptions: parzen.prior_weight must be >= 0, got {}",
                                            options_.parzen().prior_weight()));
  }
}

std::vector<std::vector<double>> TPESampler::suggest(const SearchSpace& space, const std::vector<Observation>& observed,
                                                     const std::vector<std::vector<double>>& pending, int64_t q,
                                                     uint64_t seed) {
  if (space.empty()) throw std::invalid_argument("TPESampler: the search space has no parameters");
  if (finished_count(observed) < options_.n_startup_trials()) {
    return RandomSampler().suggest(space, observed, pending, q, seed);
  }
  const TPESplit split = tpe_split(observed, tpe_gamma(finished_count(observed)));
  // The groups of parameters proposed together: all (multivariate) or each alone; a one-choice categorical
  // has nothing to propose.
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < space.params().size(); ++i) {
    if (single(space.params()[i])) continue;
    if (options_.multivariate() && !groups.empty()) groups.front().push_back(i);
    else groups.push_back({i});
  }
  const uint64_t first = observed.size() + pending.size();
  std::vector<std::vector<double>> out;
  std::vector<std::vector<double>> lies = pending;
  for (int64_t n = 0; n < q; ++n) {
    std::mt19937_64 rng(mix_seed(seed, first + static_cast<uint64_t>(n)));
    ParamSet point;
    for (const auto& p : space.params()) {
      if (single(p)) point[p.name] = p.choices.front();
    }
    for (const auto& group : groups) {
      const TPEModel model = build_model(space, group, observed, lies, split, options_);
      const auto candidates = model.below.sample(rng, options_.n_ei_candidates());
      std::vector<double> acq;
      for (const auto& x : candidates) acq.push_back(model.below.log_pdf(x) - model.above.log_pdf(x));
      const auto& best = candidates[argmax_first(acq)];
      for (size_t j = 0; j < group.size(); ++j) {
        const Param& p = space.params()[group[j]];
        point[p.name] = external(p, best[j]);
      }
    }
    out.push_back(space.encode(point));
    lies.push_back(out.back());
  }
  return out;
}

}  // namespace trainkit::tune
