// Bayesian search: the GP's posterior, log marginal likelihood and its gradient equal scikit-learn's for fixed
// hyperparameters, the acquisitions and their derivatives equal their closed forms (60-digit mpmath, deep into
// the tail), the Sobol design equals scipy's, the L-BFGS and a one-start hyperparameter fit follow PyTorch's
// torch.optim.LBFGS (all golden); the double-precision posterior equals the tensor path and its autograd; the
// hyperparameter fit, jitter escalation, acquisition optimizer, search space, study (reproducible, resumable,
// failed trials, batches) and median pruner behave.
#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "support.h"
#include "tune/detail/lbfgs.h"
#include "trainkit/tune/acquisition.h"
#include "trainkit/tune/gaussian_process.h"
#include "trainkit/tune/pruner.h"
#include "trainkit/tune/sampler.h"
#include "trainkit/tune/search_space.h"
#include "trainkit/tune/sobol.h"
#include "trainkit/tune/study.h"

using namespace trainkit::tune;
using trainkit::test::WhatContains;

namespace {

std::vector<double> numbers(const toml::node_view<const toml::node>& v) {
  std::vector<double> out;
  for (const auto& x : *v.as_array()) out.push_back(x.value<double>().value());
  return out;
}

at::Tensor f64(const std::vector<double>& v) { return torch::tensor(v, torch::kFloat64); }

bool close(double a, double b, double rel) { return std::abs(a - b) <= rel * std::max(1.0, std::abs(b)); }

double quadratic(const ParamSet& p) {
  const double x = std::get<double>(p.at("x"));
  const double y = std::get<double>(p.at("y"));
  return (x - 0.3) * (x - 0.3) + 2 * (y + 0.2) * (y + 0.2);
}

SearchSpace square() { return SearchSpace().add_float("x", -1, 1).add_float("y", -1, 1); }

// A golden [[gp]] case's model: its hyperparameters, then its data.
GaussianProcess golden_gp(const toml::node_view<const toml::node>& c) {
  const int64_t d = c["d"].value<int64_t>().value();
  GaussianProcess gp;
  GPHyperparameters h;
  h.lengthscales = numbers(c["lengthscales"]);
  h.outputscale = c["outputscale"].value<double>().value();
  h.noise = c["noise"].value<double>().value();
  h.mean = c["mean"].value<double>().value();
  gp.set_hyperparameters(h);
  gp.set_data(f64(numbers(c["x"])).view({-1, d}), f64(numbers(c["y"])));
  return gp;
}

// A lighter GPSampler than the defaults (fewer fit restarts and ascent steps) so that a study test takes
// seconds; the defaults are what bench/bench_tune measures.
GPSamplerOptions light(int64_t n_startup) {
  return GPSamplerOptions()
      .n_startup_trials(n_startup)
      .gp(GaussianProcessOptions().restarts(2).max_iter(30))
      .acquisition(AcquisitionOptions().raw_samples(128).num_restarts(4).steps(40));
}

}  // namespace

TEST_CASE("GP posterior and log marginal likelihood equal scikit-learn's", "[tune][bayes][golden]") {
  const auto& g = trainkit::test::golden("bayes.toml");
  const auto& cases = *g["gp"].as_array();
  REQUIRE(cases.size() == 3);
  for (const auto& node : cases) {
    const toml::node_view<const toml::node> c{node};
    INFO(c["name"].value<std::string>().value());
    const int64_t d = c["d"].value<int64_t>().value();
    const auto gp = golden_gp(c);
    CHECK(gp.jitter() == 0);
    CHECK(close(gp.log_marginal_likelihood(), c["lml"].value<double>().value(), 1e-8));
    const auto xq = f64(numbers(c["xq"])).view({-1, d});
    auto [mean, var] = gp.predict(xq);
    auto [mean_n, var_n] = gp.predict(xq, /*with_noise=*/true);
    const auto em = numbers(c["pred_mean"]);
    const auto ev = numbers(c["pred_var"]);
    const auto evn = numbers(c["pred_var_noisy"]);
    for (size_t i = 0; i < em.size(); ++i) {
      CHECK(close(mean[static_cast<int64_t>(i)].item<double>(), em[i], 1e-8));
      CHECK(close(var[static_cast<int64_t>(i)].item<double>(), ev[i], 1e-8));
      CHECK(close(var_n[static_cast<int64_t>(i)].item<double>(), evn[i], 1e-8));
      CHECK(close(mean_n[static_cast<int64_t>(i)].item<double>(), em[i], 1e-8));
    }
  }
}

TEST_CASE("the GP's likelihood gradient equals scikit-learn's", "[tune][bayes][golden]") {
  const auto& g = trainkit::test::golden("bayes.toml");
  for (const auto& node : *g["gp"].as_array()) {
    const toml::node_view<const toml::node> c{node};
    INFO(c["name"].value<std::string>().value());
    const int64_t d = c["d"].value<int64_t>().value();
    const auto gp = golden_gp(c);
    const auto got = gp.log_marginal_likelihood_gradient();
    const auto want = numbers(c["lml_grad"]);
    REQUIRE(got.size() == static_cast<size_t>(d + 3));
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("component " << i);
      CHECK(std::abs(got[i] - want[i]) <= 1e-7 * std::max(1.0, std::abs(want[i])));
    }
  }
  CHECK_THROWS_MATCHES(GaussianProcess().log_marginal_likelihood_gradient(), std::logic_error,
                       WhatContains("set_data first"));
}

TEST_CASE("the double-precision posterior equals the tensor path and its autograd", "[tune][bayes]") {
  const auto& g = trainkit::test::golden("bayes.toml");
  const toml::node_view<const toml::node> c{(*g["gp"].as_array())[2]};  // 6-d, tiny noise, mean -0.3
  const int64_t d = c["d"].value<int64_t>().value();
  const auto gp = golden_gp(c);
  const auto x = f64(numbers(c["x"])).view({-1, d});
  // The golden query points, a training input (ρ = 0 to the first point) and one far outside the data.
  auto xq = torch::cat({f64(numbers(c["xq"])).view({-1, d}), x.narrow(0, 0, 1), torch::full({1, d}, 3.0, torch::kFloat64)});
  const int64_t m = xq.size(0);
  std::vector<double> q(xq.data_ptr<double>(), xq.data_ptr<double>() + m * d);
  std::vector<double> mean(m), var(m), gm(m * d), gv(m * d), mean2(m), var2(m);
  gp.posterior(q.data(), m, mean.data(), var.data(), gm.data(), gv.data());
  gp.posterior(q.data(), m, mean2.data(), var2.data());
  auto xt = xq.clone().requires_grad_(true);
  auto [tm, tv] = gp.predict_standardized(xt);
  const auto dm = torch::autograd::grad({tm.sum()}, {xt}, {}, /*retain_graph=*/true)[0];
  const auto dv = torch::autograd::grad({tv.sum()}, {xt})[0];
  for (int64_t i = 0; i < m; ++i) {
    INFO("point " << i);
    CHECK(std::abs(mean[i] - tm[i].item<double>()) <= 1e-10);
    CHECK(std::abs(var[i] - tv[i].item<double>()) <= 1e-10);
    CHECK((mean2[i] == mean[i] && var2[i] == var[i]));
    for (int64_t k = 0; k < d; ++k) {
      CHECK(std::abs(gm[i * d + k] - dm[i][k].item<double>()) <= 1e-8 * std::max(1.0, std::abs(gm[i * d + k])));
      CHECK(std::abs(gv[i * d + k] - dv[i][k].item<double>()) <= 1e-8 * std::max(1.0, std::abs(gv[i * d + k])));
    }
  }
  CHECK(var[m - 1] == Approx(gp.hyperparameters().outputscale).epsilon(1e-6));  // far from the data: the prior
  CHECK_THROWS_MATCHES(GaussianProcess().posterior(q.data(), 1, mean.data(), var.data()), std::logic_error,
                       WhatContains("set_data first"));
}

TEST_CASE("log-EI, EI, PI and UCB equal their closed forms", "[tune][bayes][golden]") {
  const auto& g = trainkit::test::golden("bayes.toml");
  const auto& cases = *g["acquisition"].as_array();
  REQUIRE(cases.size() >= 10);
  for (const auto& node : cases) {
    const toml::node_view<const toml::node> c{node};
    const double mu = c["mean"].value<double>().value();
    const double sigma = c["sigma"].value<double>().value();
    const double best = c["best"].value<double>().value();
    INFO("z = " << c["z"].value<double>().value());
    auto m = f64({mu}).requires_grad_(true);
    const auto s = f64({sigma});
    const auto log_ei = log_expected_improvement(m, s, best);
    CHECK(close(log_ei.item<double>(), c["log_ei"].value<double>().value(), 1e-12));
    log_ei.sum().backward();
    CHECK(std::isfinite(m.grad().item<double>()));  // the tail has a gradient, where EI's is 0
    CHECK(m.grad().item<double>() < 0);
    const double ei = c["ei"].value<double>().value();
    CHECK(std::abs(expected_improvement(m.detach(), s, best).item<double>() - ei) <= 1e-14 + 1e-12 * ei);
    const double pi = c["pi"].value<double>().value();
    CHECK(std::abs(probability_of_improvement(m.detach(), s, best).item<double>() - pi) <= 1e-15 + 1e-12 * pi);
    CHECK(close(upper_confidence_bound(m.detach(), s, 2.0).item<double>(), c["ucb_beta2"].value<double>().value(), 1e-14));
  }
}

TEST_CASE("acquisition_at equals the closed forms and their derivatives", "[tune][bayes][golden]") {
  const auto& g = trainkit::test::golden("bayes.toml");
  auto near = [](double got, double want, double rel, double abs) {
    return std::abs(got - want) <= abs + rel * std::abs(want);
  };
  for (const auto& node : *g["acquisition"].as_array()) {
    const toml::node_view<const toml::node> c{node};
    const double mu = c["mean"].value<double>().value();
    const double var = std::pow(c["sigma"].value<double>().value(), 2);
    const double best = c["best"].value<double>().value();
    auto want = [&](const char* key) { return c[key].value<double>().value(); };
    INFO("z = " << want("z"));
    const auto log_ei = acquisition_at(mu, var, best, AcquisitionOptions());
    CHECK(close(log_ei.value, want("log_ei"), 1e-12));
    CHECK(near(log_ei.d_mean, want("log_ei_dmean"), 1e-12, 0));
    // ∂/∂σ² = (1 − z Φ/h) / 2σ²: both terms are ~1/2σ² and cancel for large z, so the error is absolute.
    CHECK(near(log_ei.d_var, want("log_ei_dvar"), 1e-12, 1e-12 / var));
    const auto ei = acquisition_at(mu, var, best, AcquisitionOptions().name("ei"));
    CHECK(near(ei.value, want("ei"), 1e-12, 1e-14));
    CHECK(near(ei.d_mean, want("ei_dmean"), 1e-12, 1e-15));
    CHECK(near(ei.d_var, want("ei_dvar"), 1e-12, 1e-15));
    const auto pi = acquisition_at(mu, var, best, AcquisitionOptions().name("pi"));
    CHECK(near(pi.value, want("pi"), 1e-12, 1e-15));
    CHECK(near(pi.d_mean, want("pi_dmean"), 1e-12, 1e-15));
    CHECK(near(pi.d_var, want("pi_dvar"), 1e-12, 1e-15));
    const auto ucb = acquisition_at(mu, var, best, AcquisitionOptions().name("ucb").beta(2.0));
    CHECK(close(ucb.value, want("ucb_beta2"), 1e-14));
    CHECK(ucb.d_mean == -1);
    CHECK(close(ucb.d_var, std::sqrt(2.0) / (2 * std::sqrt(var)), 1e-14));
  }
  CHECK_THROWS_MATCHES(acquisition_at(0, 1, 0, AcquisitionOptions().name("qei")), std::invalid_argument,
                       WhatContains("unknown acquisition \"qei\""));
}

TEST_CASE("the L-BFGS follows torch.optim.LBFGS", "[tune][bayes][golden]") {
  // Rosenbrock's function in three variables, with its gradient.
  const trainkit::tune::detail::LbfgsObjective rosenbrock = [](const std::vector<double>& x, double& f,
                                                               std::vector<double>& grad) {
    f = 0;
    std::fill(grad.begin(), grad.end(), 0.0);
    for (size_t i = 0; i + 1 < x.size(); ++i) {
      const double a = 1 - x[i], b = x[i + 1] - x[i] * x[i];
      f += a * a + 100 * b * b;
      grad[i] += -2 * a - 400 * b * x[i];
      grad[i + 1] += 200 * b;
    }
    return true;
  };
  const auto& g = trainkit::test::golden("bayes.toml");
  for (const auto& node : *g["lbfgs"].as_array()) {
    const toml::node_view<const toml::node> c{node};
    const int64_t max_iter = c["max_iter"].value<int64_t>().value();
    INFO("max_iter " << max_iter);
    trainkit::tune::detail::LbfgsOptions o;
    o.max_iter = max_iter;
    const auto r = trainkit::tune::detail::lbfgs_minimize(rosenbrock, numbers(c["x0"]), o);
    REQUIRE(r.ok);
    const auto x = numbers(c["x"]);
    for (size_t i = 0; i < x.size(); ++i) CHECK(std::abs(r.x[i] - x[i]) <= 1e-8);
    CHECK(std::abs(r.f - c["f"].value<double>().value()) <= 1e-8 * std::max(1.0, std::abs(r.f)));
    CHECK(r.evaluations == c["evaluations"].value<int64_t>().value());
    CHECK(r.iterations == c["iterations"].value<int64_t>().value());
  }
  // An objective that cannot be evaluated ends the minimization as failed.
  const auto failed = trainkit::tune::detail::lbfgs_minimize(
      [](const std::vector<double>& x, double& f, std::vector<double>& grad) {
        f = x[0] * x[0];
        grad[0] = 2 * x[0];
        return x[0] > 0.5;
      },
      {1.0}, trainkit::tune::detail::LbfgsOptions());
  CHECK_FALSE(failed.ok);
}

TEST_CASE("a one-start GP fit equals PyTorch's LBFGS on the same objective", "[tune][bayes][golden]") {
  const auto& g = trainkit::test::golden("bayes.toml");
  const toml::node_view<const toml::node> c{(*g["fit"].as_array())[0]};
  const int64_t d = c["d"].value<int64_t>().value();
  GaussianProcess gp(GaussianProcessOptions().restarts(1));  // the one start: the defaults
  gp.set_data(f64(numbers(c["x"])).view({-1, d}), f64(numbers(c["y"])));
  std::mt19937_64 rng(0);
  const double lml = gp.fit(rng);
  CHECK(close(lml, c["lml"].value<double>().value(), 1e-8));
  const auto& h = gp.hyperparameters();
  const auto ls = numbers(c["lengthscales"]);
  for (size_t i = 0; i < ls.size(); ++i) CHECK(close(h.lengthscales[i], ls[i], 1e-5));
  CHECK(close(h.outputscale, c["outputscale"].value<double>().value(), 1e-5));
  CHECK(close(h.mean, c["mean"].value<double>().value(), 1e-5));
  CHECK(std::abs(h.noise - c["noise"].value<double>().value()) <= 1e-9);
}

TEST_CASE("unscrambled Sobol points equal scipy's", "[tune][bayes][golden]") {
  const auto& g = trainkit::test::golden("bayes.toml");
  for (const auto& node : *g["sobol"].as_array()) {
    const toml::node_view<const toml::node> c{node};
    const int64_t d = c["d"].value<int64_t>().value();
    const int64_t n = c["n"].value<int64_t>().value();
    const auto expected = numbers(c["points"]);
    Sobol sobol(d);
    for (int64_t i = 0; i < n; ++i) {
      const auto p = sobol.point(static_cast<uint64_t>(i));
      for (int64_t j = 0; j < d; ++j) REQUIRE(p[static_cast<size_t>(j)] == expected[static_cast<size_t>(i * d + j)]);
    }
  }
  // A seeded digital shift stays in [0, 1) and differs from the plain sequence.
  Sobol shifted(4, 3);
  const auto p = shifted.point(0);
  CHECK(p != Sobol(4).point(0));
  for (double v : p) CHECK((v >= 0 && v < 1));
  CHECK_THROWS_MATCHES(Sobol(22), std::invalid_argument, WhatContains("dims must be in [1, 21], got 22"));
}

TEST_CASE("Cholesky escalates jitter and then fails clearly", "[tune][bayes]") {
  // Slightly indefinite (eigenvalues 2 and -5e-13): the first jitter, 1e-10 x the mean diagonal, fixes it.
  const auto nearly = f64({1.0, 1.0, 1.0, 1.0 - 1e-12}).view({2, 2});
  double jitter = -1;
  const auto l = cholesky_with_jitter(nearly, 1e-4, &jitter);
  CHECK((jitter > 0 && jitter < 1e-9));
  CHECK(torch::allclose(l.matmul(l.t()), nearly, 0, 1e-9));
  // Two identical inputs and no noise: the GP still factorizes (with jitter if rounding needs it).
  GaussianProcess gp;
  GPHyperparameters h;
  h.lengthscales = {0.3};
  h.noise = 0;
  gp.set_hyperparameters(h);
  gp.set_data(f64({0.2, 0.2, 0.7}).view({3, 1}), f64({1.0, 1.0, 2.0}));
  CHECK(std::isfinite(gp.log_marginal_likelihood()));
  const auto bad = f64({1.0, 2.0, 2.0, 1.0}).view({2, 2});  // indefinite: eigenvalues 3 and -1
  CHECK_THROWS_MATCHES(cholesky_with_jitter(bad, 1e-4), std::runtime_error,
                       WhatContains("2x2 covariance matrix is not positive definite, even with jitter 0.0001"));
  CHECK_THROWS_MATCHES(cholesky_with_jitter(f64({1.0, 2.0}), 1e-4), std::invalid_argument,
                       WhatContains("expected a square matrix, got [2]"));
}

TEST_CASE("GP hyperparameter fit raises the likelihood and stays in bounds", "[tune][bayes]") {
  const auto x = torch::linspace(0, 1, 15, torch::kFloat64).view({-1, 1});
  const auto xy = torch::cat({x, torch::rand({15, 1}, torch::TensorOptions().dtype(torch::kFloat64))}, 1);
  const auto y = torch::sin(6 * x.squeeze(1));  // depends on the first input only
  GaussianProcess gp(GaussianProcessOptions().restarts(3));
  gp.set_data(xy, y);
  const double before = gp.log_marginal_likelihood();
  std::mt19937_64 rng(0);
  const double after = gp.fit(rng);
  CHECK(after > before + 5);
  const auto& h = gp.hyperparameters();
  CHECK(h.lengthscales[0] < 1.0);
  CHECK(h.lengthscales[1] > 2 * h.lengthscales[0]);  // the irrelevant input gets the longer lengthscale
  CHECK((h.noise >= 1e-6 && h.noise <= 1.0));
  CHECK((h.outputscale >= 0.01 && h.outputscale <= 20.0));
  // Interpolates the smooth function between the training inputs.
  auto [mean, var] = gp.predict(f64({0.5 / 14, 0.5}).view({1, 2}));
  CHECK(std::abs(mean.item<double>() - std::sin(6 * 0.5 / 14)) < 0.05);
  CHECK_THROWS_MATCHES(GaussianProcess(GaussianProcessOptions().noise_min(0)), std::invalid_argument,
                       WhatContains("noise bounds must be 0 < min < max, got [0, 1]"));
}

TEST_CASE("maximize_acquisition finds the maximum of log-EI on a grid", "[tune][bayes]") {
  GaussianProcess gp;
  GPHyperparameters h;
  h.lengthscales = {0.2};
  gp.set_hyperparameters(h);
  gp.set_data(f64({0.05, 0.3, 0.5, 0.9}).view({4, 1}), f64({1.0, 0.2, 0.4, 1.5}));
  const double best = (0.2 - gp.y_mean()) / gp.y_std();
  const auto grid = torch::linspace(0, 1, 10001, torch::kFloat64).view({-1, 1});
  at::Tensor values;
  {
    torch::NoGradGuard no_grad;
    values = acquisition_value(gp, grid, best, AcquisitionOptions());
  }
  const double grid_best = values.max().item<double>();
  for (const char* name : {"log_ei", "ei", "ucb", "pi"}) {
    INFO(name);
    std::mt19937_64 rng(1);
    const auto o = AcquisitionOptions().name(name).raw_samples(64);
    const auto u = maximize_acquisition(gp, best, o, {{0.3}}, rng);
    REQUIRE(u.size() == 1);
    CHECK((u[0] >= 0 && u[0] <= 1));
    torch::NoGradGuard no_grad;
    const double got = acquisition_value(gp, f64(u).view({1, 1}), best, o).item<double>();
    const double want = acquisition_value(gp, grid, best, o).max().item<double>();
    CHECK(got >= want - 1e-5 * std::max(1.0, std::abs(want)));
  }
  CHECK(std::isfinite(grid_best));
  CHECK_THROWS_MATCHES(validate(AcquisitionOptions().name("qei")), std::invalid_argument,
                       WhatContains("name must be log_ei, ei, ucb or pi, got \"qei\""));
}

TEST_CASE("search space encodes, decodes and rejects bad ranges", "[tune][bayes][space]") {
  SearchSpace s;
  s.add_float("lr", 1e-5, 1e-1, true).add_int("layers", 1, 4).add_categorical("opt", {"adam", "sgd", "lamb"});
  CHECK(s.dims() == 5);
  const ParamSet p{{"lr", 1e-3}, {"layers", int64_t{3}}, {"opt", std::string("sgd")}};
  const auto u = s.encode(p);
  CHECK(u[0] == Approx(0.5));
  CHECK(u[2] == 0.0);
  CHECK(u[3] == 1.0);
  const auto back = s.decode(u);
  CHECK(std::get<double>(back.at("lr")) == Approx(1e-3).epsilon(1e-12));
  CHECK(std::get<int64_t>(back.at("layers")) == 3);
  CHECK(std::get<std::string>(back.at("opt")) == "sgd");
  // Every integer gets an equal share of [0, 1].
  for (int64_t k = 1; k <= 4; ++k) {
    CHECK(std::get<int64_t>(s.decode({0.5, (static_cast<double>(k) - 0.5) / 4, 1, 0, 0}).at("layers")) == k);
  }
  CHECK(s.fingerprint() == "lr:float:log:[1e-05,0.1];layers:int:linear:[1,4];opt:categorical:[adam,sgd,lamb]");
  CHECK_THROWS_MATCHES(SearchSpace().add_float("wd", 0.1, 0.01), std::invalid_argument,
                       WhatContains("wd: empty range [0.1, 0.01]"));
  CHECK_THROWS_MATCHES(SearchSpace().add_float("lr", 0, 0.1, true), std::invalid_argument,
                       WhatContains("lr: log range needs low > 0"));
  CHECK_THROWS_MATCHES(s.encode({{"lr", 1e-3}, {"layers", int64_t{9}}, {"opt", std::string("sgd")}}),
                       std::invalid_argument, WhatContains("layers: 9 is outside [1, 4]"));
  CHECK_THROWS_MATCHES(s.encode({{"lr", 1e-3}, {"layers", int64_t{2}}}), std::invalid_argument,
                       WhatContains("opt: missing"));
}

TEST_CASE("a GP study is reproducible, resumable and beats its own initial design", "[tune][bayes][study]") {
  auto sampler = std::make_shared<GPSampler>(light(5));
  Study a(square(), sampler, StudyOptions().seed(5));
  for (int i = 0; i < 12; ++i) {
    const auto t = a.ask();
    a.tell(t.number, quadratic(t.params));
  }
  // The same seed gives the same points; a study rebuilt from the trials continues identically.
  Study b(square(), sampler, StudyOptions().seed(5));
  for (int i = 0; i < 12; ++i) {
    const auto t = b.ask();
    REQUIRE((t.params == a.trials()[static_cast<size_t>(i)].params));
    b.tell(t.number, quadratic(t.params));
  }
  Study c(square(), sampler, StudyOptions().seed(5));
  for (const auto& t : a.trials()) c.add_trial(t);
  CHECK((c.ask().params == a.ask().params));
  CHECK((b.ask().params == c.trials().back().params));

  double design_best = INFINITY;
  for (int i = 0; i < 5; ++i) design_best = std::min(design_best, a.trials()[static_cast<size_t>(i)].value);
  const auto best = a.best_trial();
  REQUIRE(best);
  CHECK(best->value < 0.02);
  CHECK(best->value < design_best / 5);
  // Another seed, another design.
  Study d(square(), sampler, StudyOptions().seed(6));
  CHECK((d.ask().params != a.trials()[0].params));
}

TEST_CASE("failed trials do not poison the GP, batches are distinct, and maximize works", "[tune][bayes][study]") {
  auto sampler = std::make_shared<GPSampler>(light(4));
  Study s(square(), sampler, StudyOptions().direction("maximize").seed(1));
  for (int i = 0; i < 14; ++i) {
    const auto t = s.ask();
    const double x = std::get<double>(t.params.at("x"));
    // The right half "diverges".
    s.tell(t.number, x > 0.5 ? std::numeric_limits<double>::quiet_NaN() : -quadratic(t.params));
  }
  int failed = 0;
  for (const auto& t : s.trials()) failed += t.state == TrialState::Failed;
  CHECK(failed >= 1);
  double design_best = -INFINITY;
  for (int i = 0; i < 4; ++i) {
    const auto& t = s.trials()[static_cast<size_t>(i)];
    if (t.state == TrialState::Complete) design_best = std::max(design_best, t.value);
  }
  INFO("best of the design " << design_best << ", best " << s.best_trial()->value);
  CHECK(s.best_trial()->value > -0.1);
  CHECK(s.best_trial()->value > design_best);
  const auto batch = s.ask(3);
  REQUIRE(batch.size() == 3);
  CHECK((batch[0].params != batch[1].params));
  CHECK((batch[1].params != batch[2].params));
  CHECK((batch[0].params != batch[2].params));
  for (const auto& t : batch) CHECK(t.state == TrialState::Running);
  CHECK_THROWS_MATCHES(s.tell(99, 1.0), std::invalid_argument, WhatContains("no trial 99"));
  s.tell(batch[0].number, 1.0);
  CHECK_THROWS_MATCHES(s.tell(batch[0].number, 1.0), std::logic_error, WhatContains("already complete"));
  CHECK_THROWS_MATCHES(Study(square(), sampler, StudyOptions().direction("up")), std::invalid_argument,
                       WhatContains("direction must be minimize or maximize, got \"up\""));
}

TEST_CASE("random search is seeded and covers the space", "[tune][bayes][study]") {
  auto sampler = std::make_shared<RandomSampler>();
  Study a(square(), sampler, StudyOptions().seed(2));
  Study b(square(), sampler, StudyOptions().seed(2));
  for (int i = 0; i < 20; ++i) {
    const auto t = a.ask();
    CHECK((t.params == b.ask().params));
    const double x = std::get<double>(t.params.at("x"));
    CHECK((x >= -1 && x <= 1));
    a.tell(t.number, quadratic(t.params));
  }
}

TEST_CASE("median pruner stops trials worse than the median at the same step", "[tune][bayes][pruner]") {
  Study s(square(), std::make_shared<RandomSampler>(), StudyOptions(),
          std::make_shared<MedianPruner>(MedianPrunerOptions().n_startup_trials(3).n_warmup_steps(1)));
  // Three completed trials with losses per epoch: medians 1.0 at step 1, 0.5 at step 2.
  const std::vector<std::vector<double>> curves = {{2.0, 1.0, 0.5}, {2.0, 0.8, 0.4}, {2.0, 1.2, 0.6}};
  for (size_t i = 0; i < curves.size(); ++i) {
    const auto t = s.ask();
    if (i < 2) CHECK_FALSE(s.report(t.number, 1, 5.0));  // fewer than 3 completed: never
    for (size_t e = 0; e < curves[i].size(); ++e) s.report(t.number, static_cast<int64_t>(e), curves[i][e]);
    s.tell(t.number, curves[i].back());
  }
  const auto good = s.ask();
  CHECK_FALSE(s.report(good.number, 0, 9.0));  // warm-up step
  CHECK_FALSE(s.report(good.number, 1, 0.9));
  CHECK_FALSE(s.report(good.number, 2, 0.5));  // at the median: kept
  const auto bad = s.ask();
  CHECK_FALSE(s.report(bad.number, 0, 3.0));
  CHECK(s.report(bad.number, 1, 1.1));
  s.prune(bad.number);
  CHECK(s.trials()[static_cast<size_t>(bad.number)].state == TrialState::Pruned);
  CHECK_THROWS_MATCHES(MedianPruner(MedianPrunerOptions().interval_steps(0)), std::invalid_argument,
                       WhatContains("interval_steps >= 1"));
}
