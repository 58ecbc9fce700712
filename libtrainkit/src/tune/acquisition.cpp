#include "trainkit/tune/acquisition.h"

#include <cmath>
#include <limits>
#include <stdexcept>

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

}  // namespace

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
  if (o.name() == "log_ei") return log_expected_improvement(mean, sigma, best);
  if (o.name() == "ei") return expected_improvement(mean, sigma, best);
  if (o.name() == "pi") return probability_of_improvement(mean, sigma, best);
  if (o.name() == "ucb") return upper_confidence_bound(mean, sigma, o.beta());
  throw std::invalid_argument(fmt::format("unknown acquisition \"{}\"", o.name()));
}

std::vector<double> maximize_acquisition(const GaussianProcess& gp, double best, const AcquisitionOptions& o,
                                         const std::vector<std::vector<double>>& anchors, std::mt19937_64& rng) {
  validate(o);
  const int64_t d = gp.dims();
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
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
  const auto candidates = torch::tensor(raw, opts).view({-1, d});
  at::Tensor scores;
  {
    torch::NoGradGuard no_grad;
    scores = acquisition_value(gp, candidates, best, o);
    scores = torch::nan_to_num(scores, -std::numeric_limits<double>::infinity());
  }
  const int64_t k = std::min<int64_t>(o.num_restarts(), candidates.size(0));
  const auto top = std::get<1>(scores.topk(k));
  auto x = candidates.index_select(0, top).clone().requires_grad_(true);
  at::Tensor best_x = candidates[top[0]].clone();
  double best_v = scores[top[0]].item<double>();
  if (o.steps() > 0) {
    torch::optim::Adam adam({x}, torch::optim::AdamOptions(o.lr()));
    for (int64_t s = 0; s < o.steps(); ++s) {
      // The step size decays linearly to 0, so the ascent settles on the maximum instead of circling it.
      static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options())
          .lr(o.lr() * (1.0 - static_cast<double>(s) / static_cast<double>(o.steps())));
      adam.zero_grad();
      const auto v = acquisition_value(gp, x, best, o);
      (-v.sum()).backward();
      adam.step();
      torch::NoGradGuard no_grad;
      x.clamp_(0.0, 1.0);
    }
    torch::NoGradGuard no_grad;
    const auto v = torch::nan_to_num(acquisition_value(gp, x, best, o), -std::numeric_limits<double>::infinity());
    const int64_t i = v.argmax().item<int64_t>();
    if (v[i].item<double>() > best_v) {
      best_v = v[i].item<double>();
      best_x = x[i].detach().clone();
    }
  }
  return std::vector<double>(best_x.data_ptr<double>(), best_x.data_ptr<double>() + d);
}

}  // namespace trainkit::tune
