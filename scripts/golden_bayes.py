"""Golden values for trainkit::tune's Bayesian search (tests/golden/bayes.toml), from independent references:
  - GP posterior mean, variance and log marginal likelihood for fixed hyperparameters from scikit-learn's
    GaussianProcessRegressor with ConstantKernel * Matern(nu=2.5, ARD) + WhiteKernel, optimizer=None, alpha=0.
    trainkit standardizes y (mean, std with divisor n: sklearn's normalize_y) and fits a constant mean m in
    those units; sklearn has no mean, so for m != 0 it is given the standardized y minus m (normalize_y=False)
    and its answers are mapped back: mean = (mu + m) * sd + ybar, var = var_sklearn * sd^2.
  - log-EI, EI, PI and UCB from their closed forms in 60-digit arithmetic (mpmath), far into the tail where
    EI underflows.
  - Sobol points from scipy.stats.qmc.Sobol(d, scramble=False).
Written by scripts/gen_golden.py (or alone: .venv/bin/python scripts/golden_bayes.py)."""
import os
import warnings

import mpmath
import numpy as np
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
    if mean == 0.0:
        gpr = GaussianProcessRegressor(kernel, alpha=0.0, optimizer=None, normalize_y=True).fit(x, y)
        mu, std = gpr.predict(xq, return_std=True)
        pred_mean, pred_var = mu, std ** 2
    else:
        target = (y - ybar) / sd - mean
        gpr = GaussianProcessRegressor(kernel, alpha=0.0, optimizer=None, normalize_y=False).fit(x, target)
        mu, std = gpr.predict(xq, return_std=True)
        pred_mean, pred_var = (mu + mean) * sd + ybar, std ** 2 * sd ** 2
    return {
        "name": name, "d": d, "lengthscales": list(ls), "outputscale": os_, "noise": noise, "mean": mean,
        "x": list(x.ravel()), "y": list(y), "xq": list(xq.ravel()),
        "lml": float(gpr.log_marginal_likelihood_value_),
        "pred_mean": list(pred_mean),
        "pred_var_noisy": list(pred_var),                    # sklearn's variance includes the WhiteKernel
        "pred_var": list(pred_var - noise * sd ** 2),        # the latent function's
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
        cases.append({"mean": mu, "sigma": sigma, "best": best, "z": float(z),
                      "log_ei": float(mpmath.log(s * h)), "ei": float(s * h), "pi": float(mpmath.ncdf(z)),
                      "ucb_beta2": float(-m + mpmath.sqrt(2) * s)})
    return cases


def sobol_cases():
    out = []
    for d, n in ((1, 8), (5, 32), (21, 64)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pts = qmc.Sobol(d, scramble=False).random(n)
        out.append({"d": d, "n": n, "points": list(pts.ravel())})
    return out


def gen_bayes(out_dir, header, toml_value):
    path = os.path.join(out_dir, "bayes.toml")
    with open(path, "w") as f:
        f.write(header)
        f.write("# scikit-learn GaussianProcessRegressor (fixed hyperparameters), mpmath closed forms, scipy Sobol.\n")
        for table, rows in (("gp", [gp_case(*c) for c in _GP_CASES]), ("acquisition", acquisitions()),
                            ("sobol", sobol_cases())):
            for row in rows:
                f.write("\n[[{}]]\n".format(table))
                for k, v in row.items():
                    f.write("{} = {}\n".format(k, toml_value(v)))
    print("wrote", path)


if __name__ == "__main__":
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gen_golden import HEADER, toml_value
    gen_bayes(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"), HEADER, toml_value)
