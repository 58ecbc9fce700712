#include "trainkit/tune/gaussian_process.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

#include "detail/dense.h"
#include "detail/lbfgs.h"

namespace trainkit::tune {
namespace {

constexpr double kLog2Pi = 1.8378770664093453;  // log(2π)
const double kSqrt5 = std::sqrt(5.0);

// The Matérn-5/2 correlation as a function of ρ²: (1 + √5ρ + 5/3 ρ²) exp(−√5ρ), and into `dg` its derivative
// in ρ², −5/6 (1 + √5ρ) exp(−√5ρ) (finite at ρ = 0, where the derivative in ρ is not).
inline double matern(double r2, double* dg) {
  const double s = kSqrt5 * std::sqrt(r2);
  const double e = std::exp(-s);
  *dg = (-5.0 / 6.0) * (1 + s) * e;
  return (1 + s + (5.0 / 3.0) * r2) * e;
}

// ρ² between row a of `x` and `q`, scaled by 1/ℓ².
inline double scaled_distance(const double* a, const double* q, const double* inv_ls2, int64_t d) {
  double r2 = 0;
  for (int64_t k = 0; k < d; ++k) {
    const double t = a[k] - q[k];
    r2 += t * t * inv_ls2[k];
  }
  return r2;
}

std::vector<double> inverse_squares(const std::vector<double>& lengthscales) {
  std::vector<double> out;
  for (double l : lengthscales) out.push_back(1 / (l * l));
  return out;
}

// The lower triangle of K = s² g(ρ_ij) + noise δ_ij (n × n, row-major), and in `dk` s² dg/dρ² below the diagonal.
void kernel_matrix(const std::vector<double>& x, int64_t n, int64_t d, const double* inv_ls2, double os, double noise,
                   std::vector<double>& k, std::vector<double>& dk) {
  k.resize(static_cast<size_t>(n * n));
  dk.resize(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      double dg = 0;
      k[i * n + j] = os * matern(scaled_distance(&x[i * d], &x[j * d], inv_ls2, d), &dg);
      dk[i * n + j] = os * dg;
    }
    k[i * n + i] = os + noise;
  }
}

// The lower Cholesky factor of k into l, adding jitter · mean(diag) · I when needed (see cholesky_with_jitter);
// returns the absolute jitter used.
double factor_with_jitter(const std::vector<double>& k, int64_t n, double max_jitter, std::vector<double>& l) {
  l.resize(static_cast<size_t>(n * n));
  if (detail::cholesky(k.data(), n, l.data())) return 0;
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) scale += k[i * n + i];
  scale /= static_cast<double>(n);
  std::vector<double> shifted = k;
  for (double rel = 1e-10; rel <= max_jitter * (1 + 1e-9); rel *= 10) {
    for (int64_t i = 0; i < n; ++i) shifted[i * n + i] = k[i * n + i] + rel * scale;
    if (detail::cholesky(shifted.data(), n, l.data())) return rel * scale;
  }
  throw std::runtime_error(fmt::format(
      "GaussianProcess: the {}x{} covariance matrix is not positive definite, even with jitter {:g} x its mean "
      "diagonal ({:g}); duplicated inputs with a tiny noise variance cause this",
      n, n, max_jitter, scale));
}

// α = (LLᵀ)⁻¹ r in place; returns ½ rᵀα + Σ log L_ii + n/2 log 2π, the negative log marginal likelihood.
double solve_and_neg_lml(const std::vector<double>& l, int64_t n, std::vector<double>& r) {
  detail::solve_lower(l.data(), n, r.data());
  double value = 0.5 * detail::dot(r.data(), r.data(), n) + 0.5 * static_cast<double>(n) * kLog2Pi;
  for (int64_t i = 0; i < n; ++i) value += std::log(l[i * n + i]);
  detail::solve_lower_transposed(l.data(), n, r.data());
  return value;
}

// ∂ log p(ỹ)/∂(log ℓ, log s², log σ_n², m) (see log_marginal_likelihood_gradient) from K's lower triangle `k`,
// its derivative `dk` (kernel_matrix), the factor `l` and α; `u` is scratch (n × n).
void lml_gradient(const std::vector<double>& x, int64_t n, int64_t d, const double* inv_ls2, double os, double noise,
                  const std::vector<double>& k, const std::vector<double>& dk, const std::vector<double>& l,
                  const std::vector<double>& alpha, std::vector<double>& u, double* grad) {
  // W = ααᵀ − K⁻¹ with K⁻¹ = UUᵀ, U = L⁻ᵀ; the gradient is ½ Σ_ij W_ij ∂K_ij/∂θ, twice the sum below the diagonal
  // plus the diagonal (where only s² and σ_n² act).
  u.resize(static_cast<size_t>(n * n));
  detail::inverse_lower_transposed(l.data(), n, u.data());
  std::fill(grad, grad + d + 3, 0.0);
  double w_diag = 0, w_k = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double* ui = &u[i * n];
    for (int64_t j = 0; j < i; ++j) {
      const double w = alpha[i] * alpha[j] - detail::dot(&u[j * n] + i, ui + i, n - i);
      w_k += w * k[i * n + j];
      const double c = w * dk[i * n + j];
      const double* xi = &x[i * d];
      const double* xj = &x[j * d];
      for (int64_t a = 0; a < d; ++a) grad[a] += c * (xi[a] - xj[a]) * (xi[a] - xj[a]);
    }
    w_diag += alpha[i] * alpha[i] - detail::dot(ui + i, ui + i, n - i);
  }
  for (int64_t a = 0; a < d; ++a) grad[a] *= -2 * inv_ls2[a];  // ∂ρ²/∂log ℓ_a = −2 (x_ia − x_ja)² / ℓ_a²
  grad[d] = w_k + 0.5 * os * w_diag;
  grad[d + 1] = 0.5 * noise * w_diag;
  double sum = 0;
  for (double v : alpha) sum += v;
  grad[d + 2] = sum;
}

// The fit's unconstrained coordinates z: a bounded positive hyperparameter is
// exp(log lo + (log hi − log lo) · sigmoid(z)), the mean is bound · tanh(z), so L-BFGS never leaves the box.
struct Box {
  double lo, hi;
  // The value at z and, into `dlog`, d log(value)/dz.
  double value(double z, double* dlog) const {
    const double s = 1 / (1 + std::exp(-z));
    const double span = std::log(hi) - std::log(lo);
    *dlog = span * s * (1 - s);
    return std::exp(std::log(lo) + span * s);
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

}  // namespace

at::Tensor cholesky_with_jitter(const at::Tensor& k, double max_jitter, double* jitter_used) {
  if (k.dim() != 2 || k.size(0) != k.size(1)) {
    throw std::invalid_argument(fmt::format("cholesky_with_jitter: expected a square matrix, got {}", c10::str(k.sizes())));
  }
  const int64_t n = k.size(0);
  const auto kd = k.to(torch::kFloat64).contiguous();
  const std::vector<double> kv(kd.data_ptr<double>(), kd.data_ptr<double>() + n * n);
  std::vector<double> l;
  const double jitter = factor_with_jitter(kv, n, max_jitter, l);
  if (jitter_used) *jitter_used = jitter;
  return torch::tensor(l, torch::kFloat64).view({n, n});
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
  const auto yd = y.to(torch::kFloat64).contiguous();
  const int64_t n = x.size(0);
  std::vector<double> ys(yd.data_ptr<double>(), yd.data_ptr<double>() + n);
  if (!std::all_of(ys.begin(), ys.end(), [](double v) { return std::isfinite(v); })) {
    throw std::invalid_argument("GaussianProcess::set_data: y has NaN or infinite values (impute failed trials first)");
  }
  const auto xd = x.to(torch::kFloat64).contiguous();
  n_ = n;
  const int64_t d = x.size(1);
  x_.assign(xd.data_ptr<double>(), xd.data_ptr<double>() + n * d);
  double sum = 0;
  for (double v : ys) sum += v;
  y_mean_ = sum / static_cast<double>(n);
  double ss = 0;
  for (double v : ys) ss += (v - y_mean_) * (v - y_mean_);
  const double sd = std::sqrt(ss / static_cast<double>(n));
  y_std_ = sd > 0 ? sd : 1.0;
  for (double& v : ys) v = (v - y_mean_) / y_std_;
  y_ = std::move(ys);
  if (static_cast<int64_t>(h_.lengthscales.size()) != d) {
    h_ = GPHyperparameters();
    h_.lengthscales.assign(static_cast<size_t>(d), 0.5);
    h_.noise = 1e-3;
  }
  d_ = d;
  factorize();
}

void GaussianProcess::set_hyperparameters(GPHyperparameters h) {
  if (n_ > 0 && static_cast<int64_t>(h.lengthscales.size()) != d_) {
    throw std::invalid_argument(fmt::format("GaussianProcess: {} lengthscales for {} input dimensions",
                                            h.lengthscales.size(), d_));
  }
  for (double l : h.lengthscales) {
    if (!(l > 0)) throw std::invalid_argument(fmt::format("GaussianProcess: lengthscale must be > 0, got {}", l));
  }
  if (!(h.outputscale > 0)) throw std::invalid_argument(fmt::format("GaussianProcess: outputscale must be > 0, got {}", h.outputscale));
  if (!(h.noise >= 0)) throw std::invalid_argument(fmt::format("GaussianProcess: noise must be >= 0, got {}", h.noise));
  if (!std::isfinite(h.mean)) throw std::invalid_argument(fmt::format("GaussianProcess: mean must be finite, got {}", h.mean));
  h_ = std::move(h);
  if (n_ > 0) factorize();
}

void GaussianProcess::factorize() {
  const auto inv_ls2 = inverse_squares(h_.lengthscales);
  std::vector<double> k, dk;
  kernel_matrix(x_, n_, d_, inv_ls2.data(), h_.outputscale, h_.noise, k, dk);
  std::vector<double> chol;
  jitter_ = factor_with_jitter(k, n_, options_.max_jitter(), chol);
  chol_ = std::move(chol);
  alpha_ = y_;
  for (double& v : alpha_) v -= h_.mean;
  lml_ = -solve_and_neg_lml(chol_, n_, alpha_);
}

std::vector<double> GaussianProcess::log_marginal_likelihood_gradient() const {
  if (n_ == 0) throw std::logic_error("GaussianProcess::log_marginal_likelihood_gradient: set_data first");
  const auto inv_ls2 = inverse_squares(h_.lengthscales);
  std::vector<double> k, dk, u, grad(static_cast<size_t>(d_ + 3));
  kernel_matrix(x_, n_, d_, inv_ls2.data(), h_.outputscale, h_.noise, k, dk);
  lml_gradient(x_, n_, d_, inv_ls2.data(), h_.outputscale, h_.noise, k, dk, chol_, alpha_, u, grad.data());
  return grad;
}

double GaussianProcess::fit(std::mt19937_64& rng) {
  if (n_ == 0) throw std::logic_error("GaussianProcess::fit: set_data first");
  const auto& o = options_;
  const Boxes box{{o.lengthscale_min(), o.lengthscale_max()},
                  {o.outputscale_min(), o.outputscale_max()},
                  {o.noise_min(), o.noise_max()},
                  o.mean_bound()};
  const int64_t d = d_;
  const int64_t n = n_;

  auto raw_of = [&](const GPHyperparameters& h) {
    std::vector<double> z;
    for (double l : h.lengthscales) z.push_back(box.ls.to_raw(l));
    z.push_back(box.os.to_raw(h.outputscale));
    z.push_back(box.noise.to_raw(h.noise));
    z.push_back(std::atanh(std::clamp(h.mean / box.mean_bound, -0.999, 0.999)));
    return z;
  };
  auto hyper_of = [&](const std::vector<double>& z) {
    GPHyperparameters h;
    double unused = 0;
    for (int64_t a = 0; a < d; ++a) h.lengthscales.push_back(box.ls.value(z[static_cast<size_t>(a)], &unused));
    h.outputscale = box.os.value(z[static_cast<size_t>(d)], &unused);
    h.noise = box.noise.value(z[static_cast<size_t>(d + 1)], &unused);
    h.mean = box.mean_bound * std::tanh(z[static_cast<size_t>(d + 2)]);
    return h;
  };
  // The negative log marginal likelihood and its gradient in z; false where K + σ_n² I is not positive
  // definite (that start is then abandoned).
  std::vector<double> inv_ls2(static_cast<size_t>(d)), dlog(static_cast<size_t>(d + 3)), grad(static_cast<size_t>(d + 3));
  std::vector<double> k, dk, l, alpha, u;
  auto neg_lml = [&](const std::vector<double>& z, double& f, std::vector<double>& g) {
    for (int64_t a = 0; a < d; ++a) {
      const double ls = box.ls.value(z[static_cast<size_t>(a)], &dlog[static_cast<size_t>(a)]);
      inv_ls2[static_cast<size_t>(a)] = 1 / (ls * ls);
    }
    const double os = box.os.value(z[static_cast<size_t>(d)], &dlog[static_cast<size_t>(d)]);
    const double noise = box.noise.value(z[static_cast<size_t>(d + 1)], &dlog[static_cast<size_t>(d + 1)]);
    const double th = std::tanh(z[static_cast<size_t>(d + 2)]);
    dlog[static_cast<size_t>(d + 2)] = box.mean_bound * (1 - th * th);
    kernel_matrix(x_, n, d, inv_ls2.data(), os, noise, k, dk);
    l.resize(k.size());
    if (!detail::cholesky(k.data(), n, l.data())) return false;
    alpha = y_;
    for (double& v : alpha) v -= box.mean_bound * th;
    f = solve_and_neg_lml(l, n, alpha);
    lml_gradient(x_, n, d, inv_ls2.data(), os, noise, k, dk, l, alpha, u, grad.data());
    for (size_t i = 0; i < grad.size(); ++i) g[i] = -grad[i] * dlog[i];
    return true;
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

  detail::LbfgsOptions lbfgs;
  lbfgs.max_iter = o.max_iter();
  double best = std::numeric_limits<double>::infinity();
  std::vector<double> best_z;
  for (size_t s = 0; s < starts.size(); ++s) {
    // The same start gives the same optimum: a fresh model's previous optimum is the default start.
    if (std::find(starts.begin(), starts.begin() + static_cast<std::ptrdiff_t>(s), starts[s]) !=
        starts.begin() + static_cast<std::ptrdiff_t>(s)) {
      continue;
    }
    const auto r = detail::lbfgs_minimize(neg_lml, starts[s], lbfgs);
    // A start that wandered where the covariance is singular fails; the others decide.
    if (r.ok && std::isfinite(r.f) && r.f < best) {
      best = r.f;
      best_z = r.x;
    }
  }
  if (!best_z.empty()) h_ = hyper_of(best_z);
  factorize();
  return lml_;
}

std::pair<at::Tensor, at::Tensor> GaussianProcess::predict_standardized(const at::Tensor& xq, bool with_noise) const {
  if (n_ == 0) throw std::logic_error("GaussianProcess::predict: set_data first");
  if (xq.dim() != 2 || xq.size(1) != d_) {
    throw std::invalid_argument(fmt::format("GaussianProcess::predict: expected m x {} inputs, got {}", d_, c10::str(xq.sizes())));
  }
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  const auto x = torch::tensor(x_, opts).view({n_, d_});
  const auto chol = torch::tensor(chol_, opts).view({n_, n_});
  const auto alpha = torch::tensor(alpha_, opts);
  const auto ls = torch::tensor(h_.lengthscales, opts);
  const auto os = torch::tensor(h_.outputscale, opts);
  const auto ks = matern52(xq, x, ls, os);  // m × n
  const auto mean = h_.mean + torch::mv(ks, alpha);
  const auto v = at::linalg_solve_triangular(chol, ks.t(), /*upper=*/false);
  auto var = h_.outputscale - v.pow(2).sum(0);
  if (with_noise) var = var + h_.noise;
  return {mean, torch::clamp_min(var, 1e-30)};
}

void GaussianProcess::posterior(const double* xq, int64_t m, double* mean, double* var, double* grad_mean,
                                double* grad_var) const {
  if (n_ == 0) throw std::logic_error("GaussianProcess::posterior: set_data first");
  const int64_t n = n_, d = d_;
  const auto inv_ls2 = inverse_squares(h_.lengthscales);
  const double os = h_.outputscale;
  const bool grads = grad_mean != nullptr && grad_var != nullptr;
  // Column c of the n × m matrices is query point c, so that the triangular solves run over all points at once.
  std::vector<double> kt(static_cast<size_t>(n * m)), dkt(grads ? static_cast<size_t>(n * m) : 0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < m; ++c) {
      double dg = 0;
      kt[i * m + c] = os * matern(scaled_distance(&x_[i * d], xq + c * d, inv_ls2.data(), d), &dg);
      if (grads) dkt[i * m + c] = os * dg;
    }
  }
  for (int64_t c = 0; c < m; ++c) mean[c] = h_.mean;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < m; ++c) mean[c] += alpha_[i] * kt[i * m + c];
  }
  std::vector<double> v = kt;
  detail::solve_lower_columns(chol_.data(), n, v.data(), m);  // L⁻¹ k*
  for (int64_t c = 0; c < m; ++c) var[c] = os;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < m; ++c) var[c] -= v[i * m + c] * v[i * m + c];
  }
  if (!grads) {
    for (int64_t c = 0; c < m; ++c) var[c] = std::max(var[c], 1e-30);
    return;
  }
  detail::solve_lower_transposed_columns(chol_.data(), n, v.data(), m);  // (K + σ_n² I)⁻¹ k*
  // ∂k_i/∂q_a = s² g'(ρ²) · 2 (q_a − x_ia) / ℓ_a²; ∂μ/∂q = Σ_i α_i ∂k_i/∂q; ∂σ²/∂q = −2 Σ_i w_i ∂k_i/∂q.
  std::fill(grad_mean, grad_mean + m * d, 0.0);
  std::fill(grad_var, grad_var + m * d, 0.0);
  for (int64_t c = 0; c < m; ++c) {
    const double* q = xq + c * d;
    double* gm = grad_mean + c * d;
    double* gv = grad_var + c * d;
    for (int64_t i = 0; i < n; ++i) {
      const double a = 2 * dkt[i * m + c];
      const double cm = alpha_[i] * a, cv = -2 * v[i * m + c] * a;
      const double* xi = &x_[i * d];
      for (int64_t k = 0; k < d; ++k) {
        const double t = (q[k] - xi[k]) * inv_ls2[k];
        gm[k] += cm * t;
        gv[k] += cv * t;
      }
    }
    if (var[c] < 1e-30) {
      var[c] = 1e-30;
      std::fill(gv, gv + d, 0.0);
    }
  }
}

std::pair<at::Tensor, at::Tensor> GaussianProcess::predict(const at::Tensor& xq, bool with_noise) const {
  auto [mean, var] = predict_standardized(xq, with_noise);
  return {mean * y_std_ + y_mean_, var * (y_std_ * y_std_)};
}

}  // namespace trainkit::tune
