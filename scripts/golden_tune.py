"""Golden values for trainkit::tune, from torch-lr-finder itself: the steepest-descent suggestion of
LRFinder.plot(suggest_lr=True) on fixed loss series, and whole LRFinder.range_test traces (exponential and
linear LRs, loss smoothing, the divergence stop, validation loss, accumulation; under bfloat16 autocast with a
GradScaler, skipped steps included). Written by
scripts/gen_golden.py."""
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
        gen_range_tests(f)
        gen_amp_range_tests(f)
    print("wrote", path)


# ---- range_test traces: torch-lr-finder's own LRFinder.range_test on a tiny float64 model and data set.

def _range_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 4, generator=g, dtype=torch.float64)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long() + (x[:, 2] > 0.8).long()
    vx = torch.randn(32, 4, generator=g, dtype=torch.float64)
    vy = (vx[:, 0] + 0.5 * vx[:, 1] > 0).long() + (vx[:, 2] > 0.8).long()
    return x, y, vx, vy


def _range_model():
    g = torch.Generator().manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
    return model


# (name, range_test keyword arguments, use the validation set, expect an early stop)
_RANGE_CASES = [
    ("exp smoothed diverges", dict(start_lr=1e-3, end_lr=300.0, num_iter=40, step_mode="exp", smooth_f=0.05,
                                   diverge_th=3.0), False, True),
    ("exp full length", dict(start_lr=1e-4, end_lr=2.0, num_iter=30, step_mode="exp", smooth_f=0.05,
                             diverge_th=5.0), False, False),
    ("linear unsmoothed", dict(start_lr=0.01, end_lr=0.5, num_iter=12, step_mode="linear", smooth_f=0.0,
                               diverge_th=5.0), False, False),
    ("exp val accumulation", dict(start_lr=1e-3, end_lr=1.0, num_iter=15, step_mode="exp", smooth_f=0.2,
                                  diverge_th=5.0, accumulation_steps=2), True, False),
]


def gen_range_tests(f):
    import contextlib
    import io

    from torch.utils.data import DataLoader, TensorDataset

    x, y, vx, vy = _range_data()
    f.write("\n# torch-lr-finder's LRFinder.range_test: SGD(momentum 0.9) on Linear(4,8)-Tanh-Linear(8,3), float64,\n")
    f.write("# cross-entropy, batches of 8 in order (DataLoader shuffle=False; the iterator restarts when exhausted).\n")
    f.write("[range_data]\nx = {}\ny = {}\nval_x = {}\nval_y = {}\n".format(
        [float(v) for v in x.flatten()], [int(v) for v in y], [float(v) for v in vx.flatten()],
        [int(v) for v in vy]).replace("'", ""))
    params = [p.detach().flatten().tolist() for p in _range_model().parameters()]
    f.write("params = [{}]\n".format(", ".join("[" + ", ".join(repr(v) for v in p) + "]" for p in params)))
    for name, kwargs, use_val, stops in _RANGE_CASES:
        model = _range_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        finder = LRFinder(model, opt, torch.nn.CrossEntropyLoss(), device="cpu")
        train = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)
        val = DataLoader(TensorDataset(vx, vy), batch_size=16, shuffle=False) if use_val else None
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            finder.range_test(train, val_loader=val, **kwargs)
        lrs, losses = finder.history["lr"], finder.history["loss"]
        stopped = len(lrs) < kwargs["num_iter"]
        assert stopped == stops, "{}: early stop {} (expected {})".format(name, stopped, stops)
        suggested = None
        if len(lrs) >= 17:
            with contextlib.redirect_stdout(io.StringIO()):
                _, suggested = finder.plot(suggest_lr=True)
            matplotlib.pyplot.close("all")
        f.write("\n[[range_test]]\nname = \"{}\"\nvalidation = {}\n".format(name, "true" if use_val else "false"))
        for k, v in kwargs.items():
            f.write("{} = {}\n".format(k, '"' + v + '"' if isinstance(v, str) else repr(v)))
        if suggested is not None:
            f.write("suggested_lr = {!r}\n".format(float(suggested)))
        f.write("lrs = [{}]\n".format(", ".join(repr(float(v)) for v in lrs)))
        f.write("smoothed = [{}]\n".format(", ".join(repr(float(v)) for v in losses)))


# ---- range_test traces under bfloat16 autocast on the CPU with a GradScaler (torch-lr-finder's
# amp_backend="torch"): the same model and data in float32.

class _RecordingScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler("cpu") that records, per update(), the scale the step's backward used and whether
    the step was skipped (the scale falls only on a backoff, after inf/NaN gradients)."""

    def __init__(self, **kwargs):
        super().__init__("cpu", **kwargs)
        self.scales, self.skipped = [], []

    def update(self, new_scale=None):
        before = self.get_scale()
        super().update(new_scale)
        self.scales.append(before)
        self.skipped.append(self.get_scale() < before)


# (name, range_test keyword arguments, GradScaler keyword arguments, loss reduction, use the validation set,
# expect skips)
_AMP_CASES = [
    ("bf16 scaler exp", dict(start_lr=1e-3, end_lr=30.0, num_iter=30, step_mode="exp", smooth_f=0.05,
                             diverge_th=5.0), dict(), "mean", False, False),
    # A summed loss and a scale of 2^124 that doubles after every clean step overflow the float32 gradients
    # within a few steps: the scaler skips those steps and backs off, again and again.
    ("bf16 scaler skips accumulation", dict(start_lr=1e-3, end_lr=1.0, num_iter=25, step_mode="exp", smooth_f=0.1,
                                            diverge_th=5.0, accumulation_steps=2),
     dict(init_scale=2.0 ** 124, growth_interval=1), "sum", False, True),
    ("bf16 scaler val", dict(start_lr=1e-3, end_lr=1.0, num_iter=15, step_mode="linear", smooth_f=0.2,
                             diverge_th=5.0), dict(), "mean", True, False),
]


def gen_amp_range_tests(f):
    import contextlib
    import io

    from torch.utils.data import DataLoader, TensorDataset

    x, y, vx, vy = _range_data()
    x, vx = x.float(), vx.float()
    f.write("\n# torch-lr-finder's LRFinder.range_test with amp_backend=\"torch\", amp_config bfloat16 CPU autocast and a\n")
    f.write("# torch.amp.GradScaler(\"cpu\"): the range_data model and data in float32, SGD(momentum 0.9), cross-entropy.\n")
    f.write("# skipped: the scaler skipped the step (its scale fell); scales: the scale of each step's backward.\n")
    for name, kwargs, scaler_kwargs, reduction, use_val, skips in _AMP_CASES:
        model = _range_model().float()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scaler = _RecordingScaler(**scaler_kwargs)
        finder = LRFinder(model, opt, torch.nn.CrossEntropyLoss(reduction=reduction), device="cpu", amp_backend="torch",
                          amp_config=dict(device_type="cpu", dtype=torch.bfloat16), grad_scaler=scaler)
        train = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)
        val = DataLoader(TensorDataset(vx, vy), batch_size=16, shuffle=False) if use_val else None
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            finder.range_test(train, val_loader=val, **kwargs)
        lrs, losses = finder.history["lr"], finder.history["loss"]
        assert len(scaler.skipped) == len(lrs)
        assert any(scaler.skipped) == skips, "{}: skipped steps {}".format(name, scaler.skipped)
        f.write("\n[[range_test_amp]]\nname = \"{}\"\nvalidation = {}\nreduction = \"{}\"\n".format(
            name, "true" if use_val else "false", reduction))
        for k, v in list(kwargs.items()) + list(scaler_kwargs.items()):
            f.write("{} = {}\n".format(k, '"' + v + '"' if isinstance(v, str) else repr(v)))
        f.write("lrs = [{}]\n".format(", ".join(repr(float(v)) for v in lrs)))
        f.write("smoothed = [{}]\n".format(", ".join(repr(float(v)) for v in losses)))
        f.write("skipped = [{}]\n".format(", ".join("true" if s else "false" for s in scaler.skipped)))
        f.write("scales = [{}]\n".format(", ".join(repr(float(v)) for v in scaler.scales)))
