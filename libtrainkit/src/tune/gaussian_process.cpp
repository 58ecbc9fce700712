#include "trainkit/tune/gaussian_process.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

namespace trainkit::tune {
namespace {

constexpr double kLog2Pi = 1.8378770664093453;  // log(2π)
const double kSqrt5 = std::sqrt(5.0);

// The fit's unconstrained coordinates z: a bounded positive hyperparameter is
// exp(log lo + (log hi − log lo) · sigmoid(z)), the mean is bound · tanh(z), so L-BFGS never leaves the box.
struct Box {
  double lo, hi;
  at::Tensor to_value(const at::Tensor& z) const {
    return torch::exp(std::log(lo) + (std::log(hi) - std::log(lo)) * torch::sigmoid(z));
  }
  double to_raw(double v) const {
    const double t = (std::log(std::clamp(v, lo, hi)) - std::log(lo)) / (std::log(hi) - std::log(lo));
    const double c = std::clamp(t, 1e-6, 1 - 1e-6);
    return std::log(c / (1 - c));
  }
};

struct Boxes {
  Box ls, os, noise;
  double mean_bound;
};

// An L-BFGS start whose factorization failed.
struct NotPositiveDefinite {};

}  // namespace

at::Tensor cholesky_with_jitter(const at::Tensor& k, double max_jitter, double* jitter_used) {
  auto [l, info] = at::linalg_cholesky_ex(k);
  if (info.item<int64_t>() == 0) {
    if (jitter_used) *jitter_used = 0;
    return l;
  }
  const double scale = k.diagonal().mean().item<double>();
  const auto eye = torch::eye(k.size(0), k.options());
  double rel = 1e-10;
  for (; rel <= max_jitter * (1 + 1e-9); rel *= 10) {
    std::tie(l, info) = at::linalg_cholesky_ex(k + eye * (rel * scale));
    if (info.item<int64_t>() == 0) {
      if (jitter_used) *jitter_used = rel * scale;
      return l;
    }
  }
  throw std::runtime_error(fmt::format(
      "GaussianProcess: the {}x{} covariance matrix is not positive definite, even with jitter {:g} x its mean "
      "diagonal ({:g}); duplicated inputs with a tiny noise variance cause this",
      k.size(0), k.size(0), max_jitter, scale));
}

GaussianProcess::GaussianProcess(GaussianProcessOptions options) : options_(options) {
  const auto& o = options_;
  if (!(o.lengthscale_min() > 0 && o.lengthscale_min() < o.lengthscale_max())) {
    throw std::invalid_argument(fmt::format("GaussianProcessOptions: lengthscale bounds must be 0 < min < max, got [{}, {}]",
                                            o.lengthscale_min(), o.lengthscale_max()));
  }
  if (!(o.outputscale_min() > 0 && o.outputscale_min() < o.outputscale_max())) {
    throw std::invalid_argument(fmt::format("GaussianProcessOptions: outputscale bounds must be 0 < min < max, got [{}, {}]",
                                            o.outputscale_min(), o.outputscale_max()));
  }
  if (!(o.noise_min() > 0 && o.noise_min() < o.noise_max())) {
    throw std::invalid_argument(fmt::format("GaussianProcessOptions: noise bounds must be 0 < min < max, got [{}, {}]",
                                            o.noise_min(), o.noise_max()));
  }
  if (!(o.mean_bound() > 0)) {
    throw std::invalid_argument(fmt::format("GaussianProcessOptions: mean_bound must be > 0, got {}", o.mean_bound()));
  }
  if (o.restarts() < 1 || o.max_iter() < 1) {
    throw std::invalid_argument(fmt::format("GaussianProcessOptions: restarts and max_iter must be >= 1, got {} and {}",
                                            o.restarts(), o.max_iter()));
  }
  if (!(o.max_jitter() >= 0)) {
    throw std::invalid_argument(fmt::format("GaussianProcessOptions: max_jitter must be >= 0, got {}", o.max_jitter()));
  }
}

at::Tensor GaussianProcess::matern52(const at::Tensor& a, const at::Tensor& b, const at::Tensor& lengthscales,
                                     const at::Tensor& outputscale) {
  const auto as = a / lengthscales;
  const auto bs = b / lengthscales;
  const auto d2 = (as.unsqueeze(1) - bs.unsqueeze(0)).pow(2).sum(-1);
  // The clamp keeps the gradient of √d2 finite at r = 0 (the diagonal); it changes k by O(1e-30).
  const auto r = torch::sqrt(torch::clamp_min(d2, 1e-30));
  return outputscale * (1 + kSqrt5 * r + (5.0 / 3.0) * d2) * torch::exp(-kSqrt5 * r);
}

void GaussianProcess::set_data(const at::Tensor& x, const at::Tensor& y) {
  if (x.dim() != 2 || y.dim() != 1 || x.size(0) != y.size(0) || x.size(0) < 1 || x.size(1) < 1) {
    throw std::invalid_argument(fmt::format("GaussianProcess::set_data: expected x (n x d) and y (n) with n, d >= 1, "
                                            "got x {} and y {}",
                                            c10::str(x.sizes()), c10::str(y.sizes())));
  }
  auto yd = y.to(torch::kFloat64).contiguous();
  if (!torch::isfinite(yd).all().item<bool>()) {
    throw std::invalid_argument("GaussianProcess::set_data: y has NaN or infinite values (impute failed trials first)");
  }
  x_ = x.to(torch::kFloat64).contiguous();
  y_mean_ = yd.mean().item<double>();
  const double sd = yd.std(/*unbiased=*/false).item<double>();
  y_std_ = sd > 0 ? sd : 1.0;
  y_ = (yd - y_mean_) / y_std_;
  if (static_cast<int64_t>(h_.lengthscales.size()) != x_.size(1)) {
    h_ = GPHyperparameters();
    h_.lengthscales.assign(static_cast<size_t>(x_.size(1)), 0.5);
    h_.noise = 1e-3;
  }
  factorize();
}

void GaussianProcess::set_hyperparameters(GPHyperparameters h) {
  if (x_.defined() && static_cast<int64_t>(h.lengthscales.size()) != x_.size(1)) {
    throw std::invalid_argument(fmt::format("GaussianProcess: {} lengthscales for {} input dimensions",
                                            h.lengthscales.size(), x_.size(1)));
  }
  for (double l : h.lengthscales) {
    if (!(l > 0)) throw std::invalid_argument(fmt::format("GaussianProcess: lengthscale must be > 0, got {}", l));
  }
  if (!(h.outputscale > 0)) throw std::invalid_argument(fmt::format("GaussianProcess: outputscale must be > 0, got {}", h.outputscale));
  if (!(h.noise >= 0)) throw std::invalid_argument(fmt::format("GaussianProcess: noise must be >= 0, got {}", h.noise));
  if (!std::isfinite(h.mean)) throw std::invalid_argument(fmt::format("GaussianProcess: mean must be finite, got {}", h.mean));
  h_ = std::move(h);
  if (x_.defined()) factorize();
}

void GaussianProcess::factorize() {
  torch::NoGradGuard no_grad;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  const auto ls = torch::tensor(h_.lengthscales, opts);
  const auto os = torch::tensor(h_.outputscale, opts);
  const int64_t n = x_.size(0);
  const auto k = matern52(x_, x_, ls, os) + h_.noise * torch::eye(n, opts);
  chol_ = cholesky_with_jitter(k, options_.max_jitter(), &jitter_);
  const auto resid = (y_ - h_.mean).unsqueeze(1);
  alpha_ = torch::cholesky_solve(resid, chol_).squeeze(1);
  lml_ = (-0.5 * (resid.squeeze(1) * alpha_).sum() - chol_.diagonal().log().sum()).item<double>() -
         0.5 * static_cast<double>(n) * kLog2Pi;
}

double GaussianProcess::fit(std::mt19937_64& rng) {
  if (!x_.defined()) throw std::logic_error("GaussianProcess::fit: set_data first");
  const auto& o = options_;
  const Boxes box{{o.lengthscale_min(), o.lengthscale_max()},
                  {o.outputscale_min(), o.outputscale_max()},
                  {o.noise_min(), o.noise_max()},
                  o.mean_bound()};
  const int64_t d = x_.size(1);
  const int64_t n = x_.size(0);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  const auto eye = torch::eye(n, opts);

  auto raw_of = [&](const GPHyperparameters& h) {
    std::vector<double> z;
    for (double l : h.lengthscales) z.push_back(box.ls.to_raw(l));
    z.push_back(box.os.to_raw(h.outputscale));
    z.push_back(box.noise.to_raw(h.noise));
    z.push_back(std::atanh(std::clamp(h.mean / box.mean_bound, -0.999, 0.999)));
    return z;
  };
  auto hyper_of = [&](const at::Tensor& z) {
    GPHyperparameters h;
    const auto ls = box.ls.to_value(z.narrow(0, 0, d));
    h.lengthscales.assign(ls.data_ptr<double>(), ls.data_ptr<double>() + d);
    h.outputscale = box.os.to_value(z[d]).item<double>();
    h.noise = box.noise.to_value(z[d + 1]).item<double>();
    h.mean = box.mean_bound * std::tanh(z[d + 2].item<double>());
    return h;
  };
  auto neg_lml = [&](const at::Tensor& z) {
    const auto ls = box.ls.to_value(z.narrow(0, 0, d));
    const auto os = box.os.to_value(z[d]);
    const auto noise = box.noise.to_value(z[d + 1]);
    const auto mean = box.mean_bound * torch::tanh(z[d + 2]);
    const auto k = matern52(x_, x_, ls, os) + noise * eye;
    auto [l, info] = at::linalg_cholesky_ex(k);
    if (info.item<int64_t>() != 0) throw NotPositiveDefinite{};
    const auto resid = (y_ - mean).unsqueeze(1);
    const auto alpha = torch::cholesky_solve(resid, l);
    return 0.5 * (resid * alpha).sum() + l.diagonal().log().sum() + 0.5 * static_cast<double>(n) * kLog2Pi;
  };

  std::vector<std::vector<double>> starts;
  starts.push_back(raw_of(h_));  // the previous optimum (or the defaults)
  GPHyperparameters def;
  def.lengthscales.assign(static_cast<size_t>(d), 0.5);
  def.noise = 1e-3;
  starts.push_back(raw_of(def));
  std::uniform_real_distribution<double> uni(-2.0, 2.0);
  while (static_cast<int64_t>(starts.size()) < o.restarts()) {
    std::vector<double> z(static_cast<size_t>(d + 3));
    for (auto& v : z) v = uni(rng);
    starts.push_back(std::move(z));
  }
  starts.resize(static_cast<size_t>(std::max<int64_t>(o.restarts(), 1)));

  double best = std::numeric_limits<double>::infinity();
  at::Tensor best_z;
  for (const auto& s : starts) {
    auto z = torch::tensor(s, opts).requires_grad_(true);
    torch::optim::LBFGS lbfgs({z}, torch::optim::LBFGSOptions(1.0).max_iter(o.max_iter()).line_search_fn("strong_wolfe"));
    try {
      lbfgs.step([&] {
        lbfgs.zero_grad();
        auto loss = neg_lml(z);
        loss.backward();
        return loss;
      });
      torch::NoGradGuard no_grad;
      const double v = neg_lml(z).item<double>();
      if (std::isfinite(v) && v < best) {
        best = v;
        best_z = z.detach().clone();
      }
    } catch (const NotPositiveDefinite&) {
      // This start wandered where the covariance is singular; the others decide.
    }
  }
  if (best_z.defined()) {
    torch::NoGradGuard no_grad;
    h_ = hyper_of(best_z);
  }
  factorize();
  return lml_;
}

std::pair<at::Tensor, at::Tensor> GaussianProcess::predict_standardized(const at::Tensor& xq, bool with_noise) const {
  if (!chol_.defined()) throw std::logic_error("GaussianProcess::predict: set_data first");
  if (xq.dim() != 2 || xq.size(1) != x_.size(1)) {
    throw std::invalid_argument(fmt::format("GaussianProcess::predict: expected m x {} inputs, got {}", x_.size(1), c10::str(xq.sizes())));
  }
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  const auto ls = torch::tensor(h_.lengthscales, opts);
  const auto os = torch::tensor(h_.outputscale, opts);
  const auto ks = matern52(xq, x_, ls, os);  // m × n
  const auto mean = h_.mean + torch::mv(ks, alpha_);
  const auto v = at::linalg_solve_triangular(chol_, ks.t(), /*upper=*/false);
  auto var = h_.outputscale - v.pow(2).sum(0);
  if (with_noise) var = var + h_.noise;
  return {mean, torch::clamp_min(var, 1e-30)};
}

std::pair<at::Tensor, at::Tensor> GaussianProcess::predict(const at::Tensor& xq, bool with_noise) const {
  auto [mean, var] = predict_standardized(xq, with_noise);
  return {mean * y_std_ + y_mean_, var * (y_std_ * y_std_)};
}

}  // namespace trainkit::tune
