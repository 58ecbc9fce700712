"""Golden values for trainkit::tune (the LR finder's steepest-descent suggestion), from torch-lr-finder's own
LRFinder.plot(suggest_lr=True) on fixed loss series. Written by scripts/gen_golden.py."""
import os

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch_lr_finder import LRFinder  # noqa: E402


def _series(kind, n):
    rng = np.random.RandomState(7)
    lrs = list(1e-7 * (10.0 / 1e-7) ** (np.arange(n) / (n - 1)))
    x = np.log10(np.array(lrs))
    if kind == "u-shape":
        loss = 2.3 - 1.5 / (1 + np.exp(-(x + 3.0) * 2.5)) + np.where(x > -1, (x + 1) ** 2 * 3, 0)
    elif kind == "noisy":
        loss = 2.3 - 1.2 / (1 + np.exp(-(x + 4.0) * 3)) + rng.normal(0, 0.03, n)
    else:  # "late drop": flat, then a steep fall near the end
        loss = 1.0 - 0.8 / (1 + np.exp(-(x - 0.3) * 6))
    # torch-lr-finder records the smoothed loss (smooth_f = 0.05).
    smoothed = []
    for i, v in enumerate(loss):
        smoothed.append(float(v) if i == 0 else 0.05 * float(v) + 0.95 * smoothed[-1])
    return [float(v) for v in lrs], smoothed


def gen_tune(out_dir, header):
    path = os.path.join(out_dir, "tune.toml")
    model = torch.nn.Linear(1, 1)
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.MSELoss())
    with open(path, "w") as f:
        f.write(header)
        f.write("# torch-lr-finder's LRFinder.plot(suggest_lr=True) (skip_start 10, skip_end 5) on fixed series.\n")
        for kind, n in (("u-shape", 100), ("noisy", 100), ("late drop", 60)):
            lrs, smoothed = _series(kind, n)
            finder.history = {"lr": lrs, "loss": smoothed}
            _, suggested = finder.plot(suggest_lr=True)
            f.write("\n[[steepest]]\nname = \"{}\"\nsuggested_lr = {!r}\n".format(kind, float(suggested)))
            f.write("lrs = [{}]\n".format(", ".join(repr(v) for v in lrs)))
            f.write("smoothed = [{}]\n".format(", ".join(repr(v) for v in smoothed)))
            matplotlib.pyplot.close("all")
    print("wrote", path)
