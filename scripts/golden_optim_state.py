"""Python-written optimizer state for trainkit::optim::load_torch_state, written by scripts/gen_golden.py.

Oracle: torch.optim (Adam, AdamW, SGD with momentum, RAdam, NAdam, Adamax, Adagrad, Adadelta, ASGD, Rprop) from
the pinned wheel, on the float64 problem of scripts/golden_optim.py with its two param groups (group 1 with
other options). Each case runs STEPS_BEFORE steps, torch.saves opt.state_dict() to optim_state/<case>.pt, and
records the parameters then and after each of STEPS_AFTER more steps (optim_state.toml). The C++ test builds the
optimizer with default options, loads the file (state and every group's options), sets the parameters and
continues.
"""
import os

import torch

from golden_optim import GROUPS, _fmt, _initial, _loss

STEPS_BEFORE = 5
STEPS_AFTER = 5

# case name -> (trainkit's optimizer name, class, options of group 0, overrides of group 1)
CASES = [
    ("adam_amsgrad", "adam", torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1, amsgrad=True),
     dict(lr=5e-3, betas=(0.85, 0.995))),
    ("adamw", "adamw", torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, maximize=True), dict(lr=5e-3, eps=1e-6)),
    ("sgd", "sgd", torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
     dict(lr=0.02, momentum=0.5, nesterov=False, dampening=0.3)),
    ("radam", "radam", torch.optim.RAdam, dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
     dict(lr=5e-3, betas=(0.85, 0.995))),
    ("nadam", "nadam", torch.optim.NAdam, dict(lr=1e-2, momentum_decay=0.1, weight_decay=0.05),
     dict(lr=5e-3, momentum_decay=0.02)),
    ("adamax", "adamax", torch.optim.Adamax, dict(lr=2e-2, weight_decay=0.1), dict(lr=1e-2, betas=(0.85, 0.995))),
    ("adagrad", "adagrad", torch.optim.Adagrad,
     dict(lr=0.1, lr_decay=0.01, weight_decay=0.05, initial_accumulator_value=0.1, eps=1e-6), dict(lr=0.05)),
    ("adadelta", "adadelta", torch.optim.Adadelta, dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.05),
     dict(lr=0.7, rho=0.95)),
    ("asgd", "asgd", torch.optim.ASGD, dict(lr=0.05, lambd=0.01, alpha=0.5, t0=3.0, weight_decay=0.05),
     dict(lr=0.03, t0=2.0)),
    ("rprop", "rprop", torch.optim.Rprop, dict(lr=0.02, etas=(0.4, 1.3), step_sizes=(1e-4, 0.05)),
     dict(lr=0.005, maximize=True)),
]


def _array(values):
    return "[" + ", ".join(_fmt(x) for x in values) + "]"


def gen_optim_state(out_dir, header):
    state_dir = os.path.join(out_dir, "optim_state")
    os.makedirs(state_dir, exist_ok=True)
    path = os.path.join(out_dir, "optim_state.toml")
    with open(path, "w") as f:
        f.write(header)
        f.write("# torch.optim state_dicts after steps_before steps (optim_state/<case>.pt), and the parameters then\n"
                "# and after each of the next steps, on the problem of scripts/golden_optim.py.\n")
        f.write("steps_before = {}\n".format(STEPS_BEFORE))
        for case, name, cls, kw, g1 in CASES:
            params = [torch.nn.Parameter(p.clone()) for p in _initial()]
            opt = cls([dict(params=[params[i] for i in GROUPS[0]]),
                       dict(params=[params[i] for i in GROUPS[1]], **g1)], **kw)
            f.write("\n[[case]]\nname = \"{}\"\noptimizer = \"{}\"\n".format(case, name))
            for step in range(1, STEPS_BEFORE + STEPS_AFTER + 1):
                opt.zero_grad()
                _loss(params).backward()
                opt.step()
                if step == STEPS_BEFORE:
                    torch.save(opt.state_dict(), os.path.join(state_dir, case + ".pt"))
                if step >= STEPS_BEFORE:
                    f.write("[[case.record]]\nstep = {}\nparams = [{}]\n".format(
                        step, ", ".join(_array(p.detach().flatten().tolist()) for p in params)))
    print("wrote", path)
