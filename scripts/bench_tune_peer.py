"""Python peer of bench/bench_tune.cpp: Optuna's TPE sampler, Optuna's GPSampler and Optuna's random sampler on
Branin and Hartmann-6, with the same seeds and evaluations. Prints median simple regret after `--evals` evaluations
and the time of one suggestion (study.ask) at that many observations.
    .venv/bin/python scripts/bench_tune_peer.py [--seeds 10] [--evals 50] [--csv curves.csv]
With --serve it answers bench_tune instead, one study per request line "gp PROBLEM SEED EVALS" on standard input,
with a line "REGRET SECONDS_PER_SUGGESTION CURVE" (CURVE: the best-so-far regret after every evaluation, comma
separated); its first line is "ready optuna VERSION greenlet yes|no" (without greenlet, Optuna's GPSampler runs
its acquisition's L-BFGS-B starts one after another instead of batched)."""
import argparse
import importlib.util
import math
import sys
import time

import numpy as np
import optuna

BRANIN_MIN = 0.39788735772973816
HARTMANN6_MIN = -3.3223680114155147
_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
_A = np.array([[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8],
               [17, 8, 0.05, 10, 0.1, 14]])
_P = 1e-4 * np.array([[1312, 1696, 5569, 124, 8283, 5886], [2329, 4135, 8307, 3736, 1004, 9991],
                      [2348, 1451, 3522, 2883, 3047, 6650], [4047, 8828, 8732, 5743, 1091, 381]])


def branin(trial):
    x1 = trial.suggest_float("x1", -5, 10)
    x2 = trial.suggest_float("x2", 0, 15)
    b, c, t = 5.1 / (4 * math.pi ** 2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1 ** 2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


def hartmann6(trial):
    x = np.array([trial.suggest_float("x{}".format(i), 0, 1) for i in range(6)])
    return float(-np.sum(_ALPHA * np.exp(-np.sum(_A * (x - _P) ** 2, axis=1))))


def make_sampler(method, seed):
    if method == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if method == "gp":
        return optuna.samplers.GPSampler(seed=seed)  # Matern-5/2 ARD, log-EI; 10 random startup trials
    return optuna.samplers.RandomSampler(seed=seed)


def run_study(method, f, fmin, seed, evals):
    """One study: best-so-far regret after each evaluation, and the time of the next suggestion."""
    study = optuna.create_study(sampler=make_sampler(method, seed))
    study.optimize(f, n_trials=evals)
    values = [t.value for t in study.trials]
    start = time.perf_counter()
    t = study.ask()  # the suggestion at `evals` observations (parameters are drawn by f)
    f(t)
    return np.minimum.accumulate(values) - fmin, time.perf_counter() - start


def serve():
    """bench_tune's side of the peer: studies on request, so that it can interleave them with its own."""
    import warnings
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    problems = {"branin": (branin, BRANIN_MIN), "hartmann6": (hartmann6, HARTMANN6_MIN)}
    run_study("gp", branin, BRANIN_MIN, 0, 12)  # imports what GPSampler loads lazily, before any clock runs
    greenlet = "yes" if importlib.util.find_spec("greenlet") else "no"
    print("ready optuna {} greenlet {}".format(optuna.__version__, greenlet), flush=True)
    for line in sys.stdin:
        method, name, seed, evals = line.split()
        assert method == "gp", "the peer serves GPSampler studies only, asked for " + method
        f, fmin = problems[name]
        curve, seconds = run_study(method, f, fmin, int(seed), int(evals))
        print("{!r} {!r} {}".format(float(curve[-1]), seconds, ",".join(repr(float(v)) for v in curve)), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--evals", type=int, default=50)
    ap.add_argument("--csv")
    ap.add_argument("--serve", action="store_true", help="answer bench_tune's requests on standard input")
    args = ap.parse_args()
    if args.serve:
        return serve()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    print("{:<10} {:<8} {:>22} {:>26} {:>14}".format("problem", "method", "median regret @{}".format(args.evals),
                                                      "regret quartiles (25/75%)", "s/suggestion"))
    for name, f, fmin in (("branin", branin, BRANIN_MIN), ("hartmann6", hartmann6, HARTMANN6_MIN)):
        for method in ("tpe", "gp", "random"):
            finals, times, curves = [], [], []
            for seed in range(args.seeds):
                curve, seconds = run_study(method, f, fmin, seed, args.evals)
                curves.append(curve)
                finals.append(curve[-1])
                times.append(seconds)
            ordered = sorted(finals)
            q1, q3 = ordered[len(ordered) // 4], ordered[3 * len(ordered) // 4]
            print("{:<10} {:<8} {:>22.4g} {:>26} {:>14.3f}".format(name, method, float(np.median(finals)),
                                                                  "{:.3g} / {:.3g}".format(q1, q3),
                                                                  float(np.median(times))), flush=True)
            med = np.median(np.array(curves), axis=0)
            rows += ["{},{},{},{:.6g}".format(name, "optuna_" + method, i + 1, v) for i, v in enumerate(med)]
    # ---- Optuna's TPE beside trainkit's (bench_tune's TPE table): median regret and the time of one suggestion
    # when the study holds `evals` and 4 x `evals` observations (50 and 200).
    marks = [args.evals, 4 * args.evals]
    print("\n{:<10} {:<10} {:>12} {:>22} {:>26} {:>14}".format("problem", "method", "observations", "median regret",
                                                               "regret quartiles (25/75%)", "s/suggestion"))
    for name, f, fmin in (("branin", branin, BRANIN_MIN), ("hartmann6", hartmann6, HARTMANN6_MIN)):
        regret, seconds, curves = [[] for _ in marks], [[] for _ in marks], []
        for seed in range(args.seeds):
            study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
            best, curve = math.inf, []
            for i in range(marks[-1] + 1):
                start = time.perf_counter()
                t = study.ask()
                y = f(t)  # the parameters are drawn by f
                s = time.perf_counter() - start
                for m, mark in enumerate(marks):
                    if i == mark:
                        seconds[m].append(s)
                        regret[m].append(best - fmin)
                if i == marks[-1]:
                    break
                study.tell(t, y)
                best = min(best, y)
                curve.append(best - fmin)
            curves.append(curve)
        for m, mark in enumerate(marks):
            ordered = sorted(regret[m])
            print("{:<10} {:<10} {:>12} {:>22.4g} {:>26} {:>14.4f}".format(
                name, "optuna_tpe", mark, float(np.median(regret[m])),
                "{:.3g} / {:.3g}".format(ordered[len(ordered) // 4], ordered[3 * len(ordered) // 4]),
                float(np.median(seconds[m]))), flush=True)
        med = np.median(np.array(curves), axis=0)
        rows += ["{},{},{},{:.6g}".format(name, "optuna_tpe_long", i + 1, v) for i, v in enumerate(med)]
    if args.csv:
        with open(args.csv, "w") as out:
            out.write("problem,method,evaluation,median_regret\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
