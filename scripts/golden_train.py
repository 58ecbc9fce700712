"""Golden values for trainkit::train's weight averaging, written by scripts/gen_golden.py.

- ModelEma: timm.utils.ModelEmaV3 (float64) fed a fixed sequence of model states (parameters and buffers
  drawn from a seeded generator), one update per state with step = 1, 2, ...
- AveragedModel: torch.optim.swa_utils.AveragedModel with the default running mean, with get_ema_avg_fn,
  and with use_buffers=True, fed the same states.
- SWALR: the LRs of two param groups over steps, for cos / linear annealing and anneal_epochs 0.
- update_bn: BatchNorm statistics after torch.optim.swa_utils.update_bn over three batches.
- label_smoothing: torch.nn.functional.cross_entropy(..., label_smoothing=s) of fixed class scores (float32).
"""
import os

import torch
from timm.utils.model_ema import ModelEmaV3
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_avg_fn, update_bn

STEPS = 6


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(),
                               torch.nn.Linear(4, 2)).double()


def _states(model):
    """STEPS model states: every floating tensor random, num_batches_tracked = step."""
    g = torch.Generator().manual_seed(1)
    states = []
    for k in range(STEPS):
        s = {}
        for name, t in model.state_dict().items():
            if t.is_floating_point():
                s[name] = torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1
                if name.endswith("running_var"):
                    s[name] = s[name].abs() + 0.5
            else:
                s[name] = torch.full(t.shape, k + 3, dtype=t.dtype)
        states.append(s)
    return states


def _flat(model):
    return {name: [float(x) for x in t.flatten().tolist()] for name, t in model.state_dict().items()}


def _write_state(f, table, values):
    f.write("\n[[{}]]\n".format(table))
    for name, v in values.items():
        f.write('"{}" = [{}]\n'.format(name, ", ".join(repr(x) for x in v)))


def gen_train(out_dir, header):
    path = os.path.join(out_dir, "train.toml")
    model = _model()
    states = _states(model)
    names = list(model.state_dict().keys())
    with open(path, "w") as f:
        f.write(header)
        f.write("# Model: Sequential(Linear(3,4), BatchNorm1d(4), ReLU, Linear(4,2)), float64. Tensors by state_dict\n")
        f.write("# name, flattened. [[initial]]: the model at construction; [[state]]: the states fed in order.\n")
        f.write("names = [{}]\n".format(", ".join('"{}"'.format(n) for n in names)))
        _write_state(f, "initial", _flat(model))
        for s in states:
            _write_state(f, "state", {n: [float(x) for x in t.flatten().tolist()] for n, t in s.items()})

        ema_cases = [
            ("plain", dict(decay=0.9)),
            ("warmup", dict(decay=0.99, min_decay=0.1, update_after_step=2, use_warmup=True, warmup_gamma=1.0,
                            warmup_power=2 / 3)),
            ("exclude_buffers", dict(decay=0.8, exclude_buffers=True)),
        ]
        for case, kwargs in ema_cases:
            m = _model()
            ema = ModelEmaV3(m, **kwargs)
            f.write("\n[ema_{}]\n".format(case))
            for k, v in kwargs.items():
                f.write("{} = {}\n".format(k, "true" if v is True else repr(v)))
            f.write("decays = [{}]\n".format(", ".join(repr(ema.get_decay(i + 1)) for i in range(STEPS))))
            for i, s in enumerate(states):
                m.load_state_dict(s)
                ema.update(m, step=i + 1)
                _write_state(f, "ema_{}_after".format(case), _flat(ema.module))

        swa_cases = [("swa", dict()), ("ema_fn", dict(avg_fn=get_ema_avg_fn(0.75))), ("use_buffers",
                                                                                    dict(use_buffers=True))]
        for case, kwargs in swa_cases:
            m = _model()
            avg = AveragedModel(m, **kwargs)
            for i, s in enumerate(states):
                m.load_state_dict(s)
                avg.update_parameters(m)
                _write_state(f, "swa_{}_after".format(case), _flat(avg.module))

        for case, kwargs in [("cos", dict(anneal_epochs=3, anneal_strategy="cos")),
                             ("linear", dict(anneal_epochs=2, anneal_strategy="linear")),
                             ("none", dict(anneal_epochs=0, anneal_strategy="cos"))]:
            p = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
            opt = torch.optim.SGD([{"params": [p[0]], "lr": 0.1}, {"params": [p[1]], "lr": 0.04}], lr=0.1)
            sched = SWALR(opt, swa_lr=0.01, **kwargs)
            lrs = [list(sched.get_last_lr())]
            for _ in range(5):
                opt.step()
                sched.step()
                lrs.append(list(sched.get_last_lr()))
            f.write("\n[swalr_{}]\nanneal_epochs = {}\nanneal_strategy = \"{}\"\nlrs = [{}]\n".format(
                case, kwargs["anneal_epochs"], kwargs["anneal_strategy"],
                ", ".join("[" + ", ".join(repr(x) for x in l) + "]" for l in lrs)))

        m = _model()
        m.load_state_dict(states[0])
        g = torch.Generator().manual_seed(2)
        batches = [torch.randn(n, 3, generator=g, dtype=torch.float64) for n in (5, 5, 3)]
        update_bn(batches, m)
        f.write("\n[update_bn]\n# the model in states[0], then update_bn over these batches (3 features each)\n")
        f.write("batches = [{}]\n".format(", ".join(
            "[" + ", ".join(repr(x) for x in b.flatten().tolist()) + "]" for b in batches)))
        f.write("momentum = {}\n".format(repr(m[1].momentum)))
        f.write("running_mean = [{}]\n".format(", ".join(repr(x) for x in m[1].running_mean.tolist())))
        f.write("running_var = [{}]\n".format(", ".join(repr(x) for x in m[1].running_var.tolist())))
        f.write("num_batches_tracked = {}\n".format(int(m[1].num_batches_tracked)))

        g = torch.Generator().manual_seed(3)
        scores = torch.randn(6, 5, generator=g) * 3
        target = torch.tensor([0, 4, 2, 2, 1, 3])
        smoothing = [0.0, 0.1, 0.25, 0.9]
        f.write("\n[label_smoothing]\n# float32 class scores [6, 5] row by row, the targets, and cross_entropy's mean loss\n")
        f.write("scores = [{}]\n".format(", ".join(repr(x) for x in scores.flatten().tolist())))
        f.write("target = [{}]\n".format(", ".join(str(int(t)) for t in target)))
        f.write("smoothing = [{}]\n".format(", ".join(repr(x) for x in smoothing)))
        f.write("loss = [{}]\n".format(", ".join(
            repr(float(torch.nn.functional.cross_entropy(scores, target, label_smoothing=s))) for s in smoothing)))
    print("wrote", path)
