"""Golden trajectories for trainkit::optim, written by scripts/gen_golden.py.

Oracles: torch.optim.Adam / AdamW / SGD / RAdam / NAdam / Adamax from the pinned wheel, and timm's own Lars and Lamb.
Oracles: torch.optim.Adam / AdamW / SGD / Adagrad / Adadelta / ASGD / Rprop from the pinned wheel, and
timm's own Lars and Lamb.
The problem is small and fixed: four float64 parameters in two param groups, loss
sum_k sum(w_k * (p_k - t_k)^2) + 0.3 * sum(sin(2 p_k)), with w_k = linspace(0.5, 2, n) and
t_k = linspace(-1, 1, n) in each parameter's shape (the C++ test builds the same loss).

Low-precision cases (optim_lowp.toml): bfloat16/float16 parameters with float32 optimizer state and float32
arithmetic. Oracle: torch.optim.AdamW/Adam/SGD(fused=True) on a float32 master copy of each parameter that is
rounded to the low-precision dtype after every step and read back from it, with the gradients of the
low-precision parameters: exactly the semantics of trainkit's fused kernels for such parameters (PyTorch's
own fused kernels keep the state in the parameter's dtype, so they are not the oracle here).
"""
import os

import torch
from timm.optim import Lamb, Lars

SHAPES = [(4, 3), (3,), (2, 5), (1,)]
GROUPS = [[0, 1], [2, 3]]   # parameter indices per param group
RECORD = [1, 2, 3, 10, 50, 100, 250, 500]


def _fmt(v):
    return repr(float(v))


def _initial():
    torch.manual_seed(0)
    return [torch.randn(s, dtype=torch.float64) for s in SHAPES]


def _loss(params):
    total = 0
    for p in params:
        n = p.numel()
        w = torch.linspace(0.5, 2.0, n, dtype=torch.float64).view(p.shape)
        t = torch.linspace(-1.0, 1.0, n, dtype=torch.float64).view(p.shape)
        total = total + (w * (p - t) ** 2).sum() + 0.3 * torch.sin(2 * p).sum()
    return total


# Per-parameter state recorded beside the parameters, where the parameters alone do not show it (ASGD's average).
RECORD_STATE = {"asgd": ["ax"]}


def _run(make, steps, state_names=()):
    params = [torch.nn.Parameter(p.clone()) for p in _initial()]
    opt = make([params[i] for i in GROUPS[0]], [params[i] for i in GROUPS[1]])
    records = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        _loss(params).backward()
        opt.step()
        if step in RECORD:
            state = {k: [opt.state[p][k].flatten().tolist() for p in params] for k in state_names}
            records.append((step, [p.detach().flatten().tolist() for p in params], state))
    return records


# name -> (optimizer, defaults for group 0, overrides for group 1)
def _cases():
    cases = []
    for cls, name in ((torch.optim.Adam, "adam"), (torch.optim.AdamW, "adamw")):
        for wd in (0.0, 0.1):
            for amsgrad in (False, True):
                for maximize in (False, True):
                    kw = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd, amsgrad=amsgrad,
                              maximize=maximize)
                    g1 = dict(lr=5e-3, betas=(0.85, 0.995), weight_decay=wd / 2)
                    cases.append((name, cls, kw, g1, 250))
    for kw in (dict(lr=0.05), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01),
               dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01), dict(lr=0.02, momentum=0.5, maximize=True)):
        cases.append(("sgd", torch.optim.SGD, kw, dict(lr=kw["lr"] / 2), 100))
    for kw in (dict(lr=0.5, momentum=0.9, weight_decay=1e-3),
               dict(lr=0.5, momentum=0.9, weight_decay=1e-3, nesterov=True, trust_coeff=0.01),
               dict(lr=0.5, momentum=0.9, dampening=0.2, weight_decay=1e-3, trust_clip=True),
               dict(lr=0.5, momentum=0.0, weight_decay=0.0, always_adapt=True, eps=1e-6),
               dict(lr=0.05, momentum=0.9, weight_decay=0.0)):
        cases.append(("lars", Lars, kw, dict(lr=kw["lr"] / 2, weight_decay=0.0), 100))
    for kw in (dict(lr=1e-2),
               dict(lr=1e-2, bias_correction=False, weight_decay=0.0, always_adapt=True),
               dict(lr=1e-2, grad_averaging=False, max_grad_norm=None, trust_clip=True),
               dict(lr=2e-2, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.05, max_grad_norm=0.5),
               dict(lr=1e-2, weight_decay=0.0)):
        cases.append(("lamb", Lamb, kw, dict(lr=kw["lr"] / 2, weight_decay=0.0), 100))
    # RAdam, NAdam, Adamax: group 1 halves lr and weight decay and takes other betas. RAdam's first five steps
    # are unrectified (rho_5 = 4.996 for beta2 = 0.999), the later ones rectified: the records cross both.
    for kw in (dict(lr=1e-2),
               dict(lr=1e-2, weight_decay=0.1),
               dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
               dict(lr=2e-2, betas=(0.8, 0.99), eps=1e-6, maximize=True)):
        cases.append(("radam", torch.optim.RAdam, kw,
                      dict(lr=kw["lr"] / 2, betas=(0.85, 0.995), weight_decay=kw.get("weight_decay", 0.0) / 2), 100))
    for kw in (dict(lr=1e-2),
               dict(lr=1e-2, momentum_decay=0.1, weight_decay=0.05),
               dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, maximize=True),
               dict(lr=2e-2, betas=(0.8, 0.99), eps=1e-6, momentum_decay=0.0)):
        cases.append(("nadam", torch.optim.NAdam, kw,
                      dict(lr=kw["lr"] / 2, betas=(0.85, 0.995), momentum_decay=0.02), 100))
    for kw in (dict(lr=1e-2),
               dict(lr=1e-2, weight_decay=0.1),
               dict(lr=2e-2, betas=(0.8, 0.99), eps=1e-6, maximize=True)):
        cases.append(("adamax", torch.optim.Adamax, kw,
                      dict(lr=kw["lr"] / 2, betas=(0.85, 0.995), weight_decay=kw.get("weight_decay", 0.0) / 2), 100))
    # timm's Lion and Adafactor. Adafactor's keys are trainkit's: beta1 (timm's constructor takes betas=(beta1, _))
    # and a group's lr, whose absence (none) is the relative step in that group (timm decides it once, from the
    # constructor's lr, so a group of the other kind says so with relative_step).
    from timm.optim import Adafactor, Lion

    def adafactor(groups, lr=None, beta1=None, **kw):
        groups = [dict(g, relative_step=g["lr"] is None) if "lr" in g else g for g in groups]
        return Adafactor(groups, lr=lr, betas=None if beta1 is None else (beta1, 0.999), **kw)

    for kw, g1 in ((dict(lr=1e-3), dict(lr=5e-4)),
                   (dict(lr=2e-3, weight_decay=0.5), dict(lr=1e-3, weight_decay=0.0)),
                   (dict(lr=2e-2, betas=(0.3, 0.4)), dict(betas=(0.95, 0.98), maximize=True)),
                   (dict(lr=3e-3, betas=(0.9, 0.99), weight_decay=0.1), dict(lr=1e-3, maximize=True))):
        cases.append(("lion", Lion, kw, g1, 100))
    for kw, g1 in ((dict(min_dim_size_to_factor=2), dict(min_dim_size_to_factor=1, scale_parameter=False)),
                   (dict(min_dim_size_to_factor=2, warmup_init=True, beta1=0.9, weight_decay=0.01),
                    dict(beta1=0.5, scale_parameter=False)),
                   (dict(lr=1e-2, min_dim_size_to_factor=2, clip_threshold=0.5, decay_rate=-0.6),
                    dict(lr=5e-3, beta1=0.8, weight_decay=0.05, min_dim_size_to_factor=1)),
                   (dict(min_dim_size_to_factor=2, eps_scale=2.0), dict(lr=2e-2, beta1=0.9)),
                   (dict(lr=2e-2, beta1=0.6), dict(lr=None, eps=1e-3, weight_decay=0.1))):
        cases.append(("adafactor", adafactor, kw, g1, 100))
    # The rest of torch.optim: Adagrad, Adadelta, ASGD, Rprop (group 1 with other options each time).
    for kw in (dict(lr=0.1),
               dict(lr=0.1, lr_decay=0.01, weight_decay=0.05, initial_accumulator_value=0.1, eps=1e-6),
               dict(lr=0.05, maximize=True)):
        cases.append(("adagrad", torch.optim.Adagrad, kw, dict(lr=kw["lr"] / 2, lr_decay=0.02, weight_decay=0.01), 100))
    for kw in (dict(), dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.05), dict(lr=0.3, maximize=True)):
        cases.append(("adadelta", torch.optim.Adadelta, kw, dict(lr=0.7, rho=0.95, weight_decay=0.01), 100))
    for kw in (dict(lr=0.05), dict(lr=0.05, lambd=0.01, alpha=0.5, t0=5.0, weight_decay=0.05),
               dict(lr=0.02, t0=20.0, maximize=True)):
        cases.append(("asgd", torch.optim.ASGD, kw, dict(lr=0.03, lambd=1e-3, alpha=0.6, t0=10.0), 100))
    for kw in (dict(lr=0.01), dict(lr=0.02, etas=(0.4, 1.3), step_sizes=(1e-4, 0.05)),
               dict(lr=0.01, step_sizes=(1e-3, 0.2), maximize=True)):
        cases.append(("rprop", torch.optim.Rprop, kw, dict(lr=0.005, etas=(0.6, 1.1), step_sizes=(1e-5, 1.0)), 100))
    return cases


def gen_optim(out_dir, header):
    path = os.path.join(out_dir, "optim.toml")
    with open(path, "w") as f:
        f.write(header)
        f.write("# Parameter trajectories of torch.optim (Adam, AdamW, SGD, RAdam, NAdam, Adamax, Adagrad, Adadelta, ASGD, Rprop)\n"
                "# and timm.optim (Lars, Lamb, Lion, Adafactor; timm {}) on\n"
                "# the fixed float64 problem of scripts/golden_optim.py; two param groups.\n".format(
                    __import__("timm").__version__))
        f.write("shapes = [{}]\n".format(", ".join("[" + ", ".join(str(d) for d in s) + "]" for s in SHAPES)))
        f.write("groups = [{}]\n".format(", ".join("[" + ", ".join(str(i) for i in g) + "]" for g in GROUPS)))
        f.write("initial = [{}]\n".format(", ".join(
            "[" + ", ".join(_fmt(x) for x in p.flatten().tolist()) + "]" for p in _initial())))
        for name, cls, kw, g1, steps in _cases():
            def make(params0, params1, cls=cls, kw=kw, g1=g1):
                return cls([dict(params=params0), dict(params=params1, **g1)], **kw)
            f.write("\n[[case]]\noptimizer = \"{}\"\nsteps = {}\n".format(name, steps))
            for k, v in kw.items():
                f.write("{} = {}\n".format(k, _value(v)))
            f.write("group1 = {{ {} }}\n".format(", ".join("{} = {}".format(k, _value(v)) for k, v in g1.items())))
            for step, values, state in _run(make, steps, RECORD_STATE.get(name, ())):
                f.write("[[case.record]]\nstep = {}\nparams = [{}]\n".format(step, ", ".join(
                    "[" + ", ".join(_fmt(x) for x in p) + "]" for p in values)))
                for k, v in state.items():
                    f.write("{} = [{}]\n".format(k, ", ".join("[" + ", ".join(_fmt(x) for x in p) + "]" for p in v)))
    print("wrote", path)
    gen_optim_lowp(out_dir, header)


LOWP_RECORD = [1, 2, 3, 10, 50, 100]
LOWP_STEPS = 100


def _lowp_cases():
    return [
        ("adamw", torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.01), dict(lr=5e-3, betas=(0.85, 0.995))),
        ("adam", torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1, amsgrad=True), dict(lr=5e-3)),
        ("sgd", torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01), dict(lr=0.025)),
    ]


def _run_lowp(cls, kw, g1, dtype):
    params = [p.to(dtype) for p in _initial()]
    master = [torch.nn.Parameter(p.float()) for p in params]
    opt = cls([dict(params=[master[i] for i in GROUPS[0]]), dict(params=[master[i] for i in GROUPS[1]], **g1)],
              fused=True, **kw)
    records = []
    for step in range(1, LOWP_STEPS + 1):
        lowp = [p.clone().requires_grad_() for p in params]
        _loss(lowp).backward()
        with torch.no_grad():
            for m, q in zip(master, lowp):
                m.copy_(q.detach().float())
                m.grad = q.grad.float()
        opt.step()
        params = [m.detach().to(dtype) for m in master]
        if step in LOWP_RECORD:
            records.append((step, [p.float().flatten().tolist() for p in params]))
    return records


def gen_optim_lowp(out_dir, header):
    path = os.path.join(out_dir, "optim_lowp.toml")
    with open(path, "w") as f:
        f.write(header)
        f.write("# bfloat16/float16 parameters, float32 state and arithmetic: trajectories of torch.optim's fused\n"
                "# optimizers on float32 master copies rounded to the parameter dtype after every step (see\n"
                "# scripts/golden_optim.py); the problem, shapes, groups and initial values of optim.toml.\n")
        for dtype, dname in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
            for name, cls, kw, g1 in _lowp_cases():
                f.write("\n[[case]]\noptimizer = \"{}\"\ndtype = \"{}\"\nsteps = {}\n".format(name, dname, LOWP_STEPS))
                for k, v in kw.items():
                    f.write("{} = {}\n".format(k, _value(v)))
                f.write("group1 = {{ {} }}\n".format(", ".join("{} = {}".format(k, _value(v)) for k, v in g1.items())))
                for step, values in _run_lowp(cls, kw, g1, dtype):
                    f.write("[[case.record]]\nstep = {}\nparams = [{}]\n".format(step, ", ".join(
                        "[" + ", ".join(_fmt(x) for x in p) + "]" for p in values)))
    print("wrote", path)


def _value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "\"none\""
    if isinstance(v, tuple):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, int):
        return str(v)
    return _fmt(v)
