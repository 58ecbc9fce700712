#include "trainkit/tune/acquisition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include <ATen/native/Math.h>  // calc_erfcx: the erfcx that torch::special_erfcx computes
#include <fmt/format.h>
#include <torch/torch.h>

namespace trainkit::tune {
namespace {

const double kLogSqrt2Pi = 0.5 * std::log(2 * M_PI);       // c1 of Ament et al.
const double kLogSqrtHalfPi = 0.5 * std::log(M_PI / 2);    // c2
const double kInvSqrtEps = 1 / std::sqrt(std::numeric_limits<double>::epsilon());

at::Tensor normal_cdf(const at::Tensor& z) { return 0.5 * torch::erfc(-z / std::sqrt(2.0)); }
at::Tensor normal_pdf(const at::Tensor& z) { return torch::exp(-0.5 * z * z - kLogSqrt2Pi); }

// log(1 − exp(x)) for x < 0 (Mächler 2012: log(−expm1(x)) near 0, log1p(−exp(x)) below −log 2).
at::Tensor log1mexp(const at::Tensor& x) {
  const auto near = torch::clamp(x, -M_LN2, -1e-300);
  const auto far = torch::clamp_max(x, -M_LN2);
  return torch::where(x > -M_LN2, torch::log(-torch::expm1(near)), torch::log1p(-torch::exp(far)));
}

at::Tensor z_score(const at::Tensor& mean, const at::Tensor& sigma, double best) { return (best - mean) / sigma; }

// The scalar path (acquisition_at): the same formulas as the tensor functions above, on one double.
double cdf_at(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }
double pdf_at(double z) { return std::exp(-0.5 * z * z - kLogSqrt2Pi); }

// log h(z) in log_h's three ranges and, into `dz`, its derivative h'(z)/h(z) = Φ(z)/h(z).
double log_h_at(double z, double* dz) {
  if (z >= -1.0) {
    const double cdf = cdf_at(z);
    const double h = pdf_at(z) + z * cdf;
    *dz = cdf / h;
    return std::log(h);
  }
  if (z < -100) {
    // The asymptotic series of both tails (Mills' ratio): Φ(z) = φ(u)/u (1 − u⁻² + 3u⁻⁴ − 15u⁻⁶ + 105u⁻⁸ …),
    // h(z) = φ(u)/u² (1 − 3u⁻² + 15u⁻⁴ − 105u⁻⁶ + 945u⁻⁸ …), u = −z; past u = 100 the next terms are below
    // 1e-16, where the closed form loses z² ε to the cancellation in h.
    const double w = 1 / (z * z);
    *dz = -z * (1 + w * (-1 + w * (3 + w * (-15 + w * 105)))) / (1 + w * (-3 + w * (15 + w * (-105 + w * 945))));
  }
  if (z < -kInvSqrtEps) return -0.5 * z * z - kLogSqrt2Pi - 2 * std::log(std::abs(z));
  // h(z) = φ(z) (1 − e^t), e^t = erfcx(−z/√2) |z| √(π/2) < 1; Φ(z) = φ(z) √(π/2) erfcx(−z/√2).
  const double ex = calc_erfcx(-z / std::sqrt(2.0));
  const double t = std::min(std::log(ex * std::abs(z)) + kLogSqrtHalfPi, -1e-300);
  const double one_minus = -std::expm1(t);
  if (z >= -100) *dz = std::exp(kLogSqrtHalfPi) * ex / one_minus;
  const double log1mexp = t > -M_LN2 ? std::log(one_minus) : std::log1p(-std::exp(t));
  return -0.5 * z * z - kLogSqrt2Pi + log1mexp;
}

enum class Kind { LogEi, Ei, Pi, Ucb };

Kind kind_of(const std::string& name) {
  if (name == "log_ei") return Kind::LogEi;
  if (name == "ei") return Kind::Ei;
  if (name == "pi") return Kind::Pi;
  if (name == "ucb") return Kind::Ucb;
  throw std::invalid_argument(fmt::format("unknown acquisition \"{}\"", name));
}

AcquisitionAt evaluate(Kind kind, double mean, double var, double best, double beta) {
  const double sigma = std::sqrt(var);
  const double z = (best - mean) / sigma;
  AcquisitionAt a;
  double d_sigma = 0;
  switch (kind) {
    case Kind::LogEi: {
      double dz = 0;
      a.value = std::log(sigma) + log_h_at(z, &dz);
      a.d_mean = -dz / sigma;
      d_sigma = (1 - dz * z) / sigma;
      break;
    }
    case Kind::Ei: {
      const double cdf = cdf_at(z), pdf = pdf_at(z);
      a.value = sigma * (pdf + z * cdf);
      a.d_mean = -cdf;
      d_sigma = pdf;  // h(z) − z h'(z) = φ(z)
      break;
    }
    case Kind::Pi: {
      const double pdf = pdf_at(z);
      a.value = cdf_at(z);
      a.d_mean = -pdf / sigma;
      d_sigma = -pdf * z / sigma;
      break;
    }
    case Kind::Ucb:
      a.value = -mean + std::sqrt(beta) * sigma;
      a.d_mean = -1;
      d_sigma = std::sqrt(beta);
      break;
  }
  a.d_var = d_sigma / (2 * sigma);
  return a;
}

// torch.nan_to_num(v, nan=−inf): what the optimizer ranks by.
double rank_value(double v) {
  if (std::isnan(v)) return -std::numeric_limits<double>::infinity();
  return std::clamp(v, std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max());
}

}  // namespace

AcquisitionAt acquisition_at(double mean, double var, double best, const AcquisitionOptions& options) {
  return evaluate(kind_of(options.name()), mean, var, best, options.beta());
}

at::Tensor log_h(const at::Tensor& z) {
  // Each branch sees z only where it is selected and a harmless constant elsewhere, so that the branch
  // torch::where discards has a finite value and gradient (a NaN there would leak through where's backward).
  const auto hi = z >= -1.0;
  const auto lo = z < -kInvSqrtEps;
  const auto z_hi = torch::where(hi, z, torch::zeros_like(z));
  const auto direct = torch::log(normal_pdf(z_hi) + z_hi * normal_cdf(z_hi));
  const auto z_mid = torch::where(hi.logical_or(lo), torch::full_like(z, -2.0), z);
  const auto mid = -0.5 * z_mid * z_mid - kLogSqrt2Pi +
                   log1mexp(torch::log(torch::special_erfcx(-z_mid / std::sqrt(2.0)) * torch::abs(z_mid)) + kLogSqrtHalfPi);
  const auto z_lo = torch::where(lo, z, torch::full_like(z, -2 * kInvSqrtEps));
  const auto tail = -0.5 * z_lo * z_lo - kLogSqrt2Pi - 2 * torch::log(torch::abs(z_lo));
  return torch::where(hi, direct, torch::where(lo, tail, mid));
}

at::Tensor expected_improvement(const at::Tensor& mean, const at::Tensor& sigma, double best) {
  const auto z = z_score(mean, sigma, best);
  return sigma * (normal_pdf(z) + z * normal_cdf(z));
}

at::Tensor log_expected_improvement(const at::Tensor& mean, const at::Tensor& sigma, double best) {
  return torch::log(sigma) + log_h(z_score(mean, sigma, best));
}

at::Tensor probability_of_improvement(const at::Tensor& mean, const at::Tensor& sigma, double best) {
  return normal_cdf(z_score(mean, sigma, best));
}

at::Tensor upper_confidence_bound(const at::Tensor& mean, const at::Tensor& sigma, double beta) {
  return -mean + std::sqrt(beta) * sigma;
}

void validate(const AcquisitionOptions& o) {
  if (o.name() != "log_ei" && o.name() != "ei" && o.name() != "ucb" && o.name() != "pi") {
    throw std::invalid_argument(fmt::format("AcquisitionOptions: name must be log_ei, ei, ucb or pi, got \"{}\"", o.name()));
  }
  if (!(o.beta() > 0)) throw std::invalid_argument(fmt::format("AcquisitionOptions: beta must be > 0, got {}", o.beta()));
  if (o.raw_samples() < 1) {
    throw std::invalid_argument(fmt::format("AcquisitionOptions: raw_samples must be >= 1, got {}", o.raw_samples()));
  }
  if (o.num_restarts() < 1) {
    throw std::invalid_argument(fmt::format("AcquisitionOptions: num_restarts must be >= 1, got {}", o.num_restarts()));
  }
  if (o.steps() < 0) throw std::invalid_argument(fmt::format("AcquisitionOptions: steps must be >= 0, got {}", o.steps()));
  if (!(o.lr() > 0)) throw std::invalid_argument(fmt::format("AcquisitionOptions: lr must be > 0, got {}", o.lr()));
}

at::Tensor acquisition_value(const GaussianProcess& gp, const at::Tensor& xq, double best, const AcquisitionOptions& o) {
  auto [mean, var] = gp.predict_standardized(xq);
  const auto sigma = torch::sqrt(var);
  switch (kind_of(o.name())) {
    case Kind::LogEi: return log_expected_improvement(mean, sigma, best);
    case Kind::Ei: return expected_improvement(mean, sigma, best);
    case Kind::Pi: return probability_of_improvement(mean, sigma, best);
    case Kind::Ucb: break;
  }
  return upper_confidence_bound(mean, sigma, o.beta());
}

std::vector<double> maximize_acquisition(const GaussianProcess& gp, double best, const AcquisitionOptions& o,
                                         const std::vector<std::vector<double>>& anchors, std::mt19937_64& rng) {
  validate(o);
  const Kind kind = kind_of(o.name());
  const int64_t d = gp.dims();
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::normal_distribution<double> gauss(0.0, 0.05);
  std::vector<double> raw;
  for (int64_t i = 0; i < o.raw_samples(); ++i) {
    for (int64_t j = 0; j < d; ++j) raw.push_back(uni(rng));
  }
  for (const auto& a : anchors) {
    if (static_cast<int64_t>(a.size()) != d) {
      throw std::invalid_argument(fmt::format("maximize_acquisition: an anchor has {} coordinates, expected {}", a.size(), d));
    }
    for (int rep = 0; rep < 8; ++rep) {
      for (int64_t j = 0; j < d; ++j) raw.push_back(std::clamp(a[static_cast<size_t>(j)] + gauss(rng), 0.0, 1.0));
    }
  }
  const int64_t m = static_cast<int64_t>(raw.size()) / d;
  std::vector<double> mean(static_cast<size_t>(m)), var(static_cast<size_t>(m)), scores(static_cast<size_t>(m));
  gp.posterior(raw.data(), m, mean.data(), var.data());
  for (int64_t c = 0; c < m; ++c) scores[c] = rank_value(evaluate(kind, mean[c], var[c], best, o.beta()).value);

  const int64_t k = std::min<int64_t>(o.num_restarts(), m);
  std::vector<int64_t> order(static_cast<size_t>(m));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
  std::vector<double> x;
  for (int64_t r = 0; r < k; ++r) x.insert(x.end(), raw.begin() + order[r] * d, raw.begin() + (order[r] + 1) * d);
  std::vector<double> best_x(raw.begin() + order[0] * d, raw.begin() + (order[0] + 1) * d);
  double best_v = scores[order[0]];
  if (o.steps() > 0) {
    // torch::optim::Adam (β = 0.9, 0.999, ε = 1e-8) on −Σ acquisition, every start in one batch.
    constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
    std::vector<double> exp_avg(x.size()), exp_avg_sq(x.size()), grad_mean(x.size()), grad_var(x.size());
    for (int64_t s = 0; s < o.steps(); ++s) {
      // The step size decays linearly to 0, so the ascent settles on the maximum instead of circling it.
      const double lr = o.lr() * (1.0 - static_cast<double>(s) / static_cast<double>(o.steps()));
      gp.posterior(x.data(), k, mean.data(), var.data(), grad_mean.data(), grad_var.data());
      const double bias1 = 1 - std::pow(kBeta1, static_cast<double>(s + 1));
      const double bias2 = 1 - std::pow(kBeta2, static_cast<double>(s + 1));
      for (int64_t c = 0; c < k; ++c) {
        const auto a = evaluate(kind, mean[c], var[c], best, o.beta());
        for (int64_t j = c * d; j < (c + 1) * d; ++j) {
          const double g = -(a.d_mean * grad_mean[j] + a.d_var * grad_var[j]);
          exp_avg[j] = exp_avg[j] * kBeta1 + g * (1 - kBeta1);
          exp_avg_sq[j] = exp_avg_sq[j] * kBeta2 + g * g * (1 - kBeta2);
          const double denom = std::sqrt(exp_avg_sq[j]) / std::sqrt(bias2) + kEps;
          x[j] = std::clamp(x[j] - (lr / bias1) * exp_avg[j] / denom, 0.0, 1.0);
        }
      }
    }
    gp.posterior(x.data(), k, mean.data(), var.data());
    int64_t i = 0;
    double v = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < k; ++c) {
      const double vc = rank_value(evaluate(kind, mean[c], var[c], best, o.beta()).value);
      if (c == 0 || vc > v) {
        v = vc;
        i = c;
      }
    }
    if (v > best_v) {
      best_v = v;
      best_x.assign(x.begin() + i * d, x.begin() + (i + 1) * d);
    }
  }
  return best_x;
}

}  // namespace trainkit::tune
