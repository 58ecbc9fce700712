"""Golden values for trainkit::tune's Bayesian search (tests/golden/bayes.toml), from independent references:
  - GP posterior mean, variance and log marginal likelihood for fixed hyperparameters from scikit-learn's
    GaussianProcessRegressor with ConstantKernel * Matern(nu=2.5, ARD) + WhiteKernel, optimizer=None, alpha=0.
    trainkit standardizes y (mean, std with divisor n: sklearn's normalize_y) and fits a constant mean m in
    those units; sklearn has no mean, so for m != 0 it is given the standardized y minus m (normalize_y=False)
    and its answers are mapped back: mean = (mu + m) * sd + ybar, var = var_sklearn * sd^2.
  - log-EI, EI, PI and UCB from their closed forms in 60-digit arithmetic (mpmath), far into the tail where
    EI underflows.
  - the gradient of the log marginal likelihood in (log lengthscales, log outputscale, log noise) from
    scikit-learn's log_marginal_likelihood(theta, eval_gradient=True), and in the mean as sum(alpha_).
  - Sobol points from scipy.stats.qmc.Sobol(d, scramble=False).
  - torch.optim.LBFGS (strong Wolfe) on Rosenbrock's function, and on trainkit's hyperparameter objective
    written in Python PyTorch with autograd (GaussianProcess::fit with one start: the defaults).
Written by scripts/gen_golden.py (or alone: .venv/bin/python scripts/golden_bayes.py)."""
import math
import os
import warnings

import mpmath
import numpy as np
import torch
from scipy.stats import qmc
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

# (name, n, d, lengthscales, outputscale, noise, mean, seed)
_GP_CASES = [
    ("zero mean 3d", 12, 3, [0.3, 0.7, 1.5], 1.7, 0.01, 0.0, 0),
    ("constant mean 2d", 9, 2, [0.25, 0.45], 0.8, 1e-4, 0.4, 1),
    ("tiny noise 6d", 20, 6, [0.5, 0.9, 0.2, 1.1, 2.0, 0.35], 2.5, 1e-6, -0.3, 2),
]


def _f(x):
    return np.sin(6 * x[:, 0]) + x[:, 1] ** 2 - 0.5 * np.cos(3 * x.sum(axis=1))


def gp_case(name, n, d, ls, os_, noise, mean, seed):
    rng = np.random.RandomState(seed)
    x = rng.rand(n, d)
    y = 3.0 * _f(x) + 7.0 + 0.05 * rng.randn(n)
    xq = rng.rand(5, d)
    kernel = ConstantKernel(os_, "fixed") * Matern(length_scale=ls, length_scale_bounds="fixed", nu=2.5) + \
        WhiteKernel(noise, "fixed")
    ybar, sd = y.mean(), y.std()
    free = ConstantKernel(os_, (1e-12, 1e12)) * Matern(length_scale=ls, length_scale_bounds=(1e-12, 1e12), nu=2.5) + \
        WhiteKernel(noise, (1e-12, 1e12))
    if mean == 0.0:
        gpr = GaussianProcessRegressor(kernel, alpha=0.0, optimizer=None, normalize_y=True).fit(x, y)
        mu, std = gpr.predict(xq, return_std=True)
        pred_mean, pred_var = mu, std ** 2
        grad_target = (y - ybar) / sd
    else:
        target = (y - ybar) / sd - mean
        gpr = GaussianProcessRegressor(kernel, alpha=0.0, optimizer=None, normalize_y=False).fit(x, target)
        mu, std = gpr.predict(xq, return_std=True)
        pred_mean, pred_var = (mu + mean) * sd + ybar, std ** 2 * sd ** 2
        grad_target = target
    g = GaussianProcessRegressor(free, alpha=0.0, optimizer=None, normalize_y=False).fit(x, grad_target)
    _, grad = g.log_marginal_likelihood(free.theta, eval_gradient=True)  # theta: log s2, log ls..., log noise
    lml_grad = list(grad[1:1 + d]) + [grad[0], grad[-1], float(g.alpha_.sum())]
    return {
        "name": name, "d": d, "lengthscales": list(ls), "outputscale": os_, "noise": noise, "mean": mean,
        "x": list(x.ravel()), "y": list(y), "xq": list(xq.ravel()),
        "lml": float(gpr.log_marginal_likelihood_value_),
        "pred_mean": list(pred_mean),
        "pred_var_noisy": list(pred_var),                    # sklearn's variance includes the WhiteKernel
        "pred_var": list(pred_var - noise * sd ** 2),        # the latent function's
        "lml_grad": lml_grad,  # d/d(log ls_1..d, log outputscale, log noise, mean)
    }


def acquisitions():
    mpmath.mp.dps = 60
    cases = []
    best = 0.25
    for mu, sigma in [(0.0, 1.0), (0.25, 0.5), (1.25, 1.0), (2.0, 0.3), (5.0, 0.5), (-1.0, 0.2), (-3.0, 2.0),
                      (20.25, 0.5), (400.25, 0.4), (1e4, 1.0), (1.0, 1e-6),
                      (100.25, 1e-6)]:
        m, s, b = mpmath.mpf(mu), mpmath.mpf(sigma), mpmath.mpf(best)
        z = (b - m) / s
        h = mpmath.npdf(z) + z * mpmath.ncdf(z)
        cdf, pdf = mpmath.ncdf(z), mpmath.npdf(z)
        # Derivatives in the mean and in the variance σ² (dz/dμ = −1/σ, dz/dσ = −z/σ, dσ/dσ² = 1/(2σ); h' = Φ).
        cases.append({"mean": mu, "sigma": sigma, "best": best, "z": float(z),
                      "log_ei": float(mpmath.log(s * h)), "ei": float(s * h), "pi": float(mpmath.ncdf(z)),
                      "ucb_beta2": float(-m + mpmath.sqrt(2) * s),
                      "log_ei_dmean": float(-cdf / (h * s)), "log_ei_dvar": float((1 - z * cdf / h) / (2 * s * s)),
                      "ei_dmean": float(-cdf), "ei_dvar": float(pdf / (2 * s)),
                      "pi_dmean": float(-pdf / s), "pi_dvar": float(-pdf * z / (2 * s * s))})
    return cases


def sobol_cases():
    out = []
    for d, n in ((1, 8), (5, 32), (21, 64)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pts = qmc.Sobol(d, scramble=False).random(n)
        out.append({"d": d, "n": n, "points": list(pts.ravel())})
    return out


def _lbfgs(fun, x0, max_iter):
    """torch.optim.LBFGS(lr=1, strong Wolfe) on fun from x0, one step() call, float64."""
    x = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([x], lr=1, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = fun(x)
        loss.backward()
        return loss

    opt.step(closure)
    state = opt.state[x]
    with torch.no_grad():
        f = float(fun(x))
    return x.detach().tolist(), f, int(state["func_evals"]), int(state["n_iter"])


def lbfgs_cases():
    def rosenbrock(x):
        return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2 + (1 - x[1]) ** 2 + 100 * (x[2] - x[1] ** 2) ** 2

    out = []
    for x0, max_iter in (([-1.2, 1.0, 0.5], 5), ([-1.2, 1.0, 0.5], 100)):
        x, f, evals, iters = _lbfgs(rosenbrock, x0, max_iter)
        out.append({"x0": x0, "max_iter": max_iter, "x": x, "f": f, "evaluations": evals, "iterations": iters})
    return out


# GaussianProcessOptions' defaults: bounds of the lengthscales, outputscale and noise, and of |mean|.
_LS, _OS, _NOISE, _MEAN_BOUND = (0.01, 20.0), (0.01, 20.0), (1e-6, 1.0), 3.0


def _to_raw(v, lo, hi):
    t = (math.log(min(max(v, lo), hi)) - math.log(lo)) / (math.log(hi) - math.log(lo))
    c = min(max(t, 1e-6), 1 - 1e-6)
    return math.log(c / (1 - c))


def _boxed(z, lo, hi):
    return torch.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * torch.sigmoid(z))


def fit_case():
    """GaussianProcess::fit's objective (its sigmoid/tanh box coordinates) minimized from its default start."""
    rng = np.random.RandomState(3)
    n, d = 15, 2
    x = rng.rand(n, d)
    y = np.sin(6 * x[:, 0]) + 0.3 * x[:, 1] + 0.1 * rng.randn(n)
    yt = torch.tensor((y - y.mean()) / y.std(), dtype=torch.float64)
    xt = torch.tensor(x, dtype=torch.float64)

    def neg_lml(z):
        ls = _boxed(z[:d], *_LS)
        os_ = _boxed(z[d], *_OS)
        noise = _boxed(z[d + 1], *_NOISE)
        mean = _MEAN_BOUND * torch.tanh(z[d + 2])
        d2 = ((xt.unsqueeze(1) - xt.unsqueeze(0)) / ls).pow(2).sum(-1)
        r = torch.sqrt(torch.clamp_min(d2, 1e-30))
        k = os_ * (1 + math.sqrt(5) * r + 5 / 3 * d2) * torch.exp(-math.sqrt(5) * r) + noise * torch.eye(n, dtype=torch.float64)
        chol = torch.linalg.cholesky(k)
        resid = (yt - mean).unsqueeze(1)
        alpha = torch.cholesky_solve(resid, chol)
        return 0.5 * (resid * alpha).sum() + chol.diagonal().log().sum() + 0.5 * n * math.log(2 * math.pi)

    z0 = [_to_raw(0.5, *_LS)] * d + [_to_raw(1.0, *_OS), _to_raw(1e-3, *_NOISE), math.atanh(0.0)]
    z, f, _, _ = _lbfgs(neg_lml, z0, 60)
    zt = torch.tensor(z, dtype=torch.float64)
    return {"d": d, "x": list(x.ravel()), "y": list(y), "lml": -f,
            "lengthscales": _boxed(zt[:d], *_LS).tolist(), "outputscale": float(_boxed(zt[d], *_OS)),
            "noise": float(_boxed(zt[d + 1], *_NOISE)), "mean": float(_MEAN_BOUND * torch.tanh(zt[d + 2]))}


def gen_bayes(out_dir, header, toml_value):
    path = os.path.join(out_dir, "bayes.toml")
    with open(path, "w") as f:
        f.write(header)
        f.write("# scikit-learn GaussianProcessRegressor (fixed hyperparameters), mpmath closed forms, scipy Sobol.\n")
        for table, rows in (("gp", [gp_case(*c) for c in _GP_CASES]), ("acquisition", acquisitions()),
                            ("sobol", sobol_cases()), ("lbfgs", lbfgs_cases()), ("fit", [fit_case()])):
            for row in rows:
                f.write("\n[[{}]]\n".format(table))
                for k, v in row.items():
                    f.write("{} = {}\n".format(k, toml_value(v)))
    print("wrote", path)


if __name__ == "__main__":
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gen_golden import HEADER, toml_value
    from golden_common import generated_on
    gen_bayes(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"),
              HEADER + generated_on(), toml_value)
