"""Golden values for trainkit::grad (clip_grad_norm_, clip_grad_value_), written by scripts/gen_golden.py."""
import os

import torch

SHAPES = [(5,), (3, 4), (2, 2, 2)]
CASES = [(p, m) for p in (1.0, 2.0, 3.5, float("inf")) for m in (0.5, 1e3)]


def _fmt(v):
    if v == float("inf"):
        return "inf"
    return repr(float(v))


def _grads():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in SHAPES]
    for p in params:
        p.grad = torch.randn(p.shape, dtype=torch.float64)
    return params


def gen_grad(out_dir, header):
    path = os.path.join(out_dir, "grad.toml")
    with open(path, "w") as f:
        f.write(header)
        f.write("# torch.nn.utils.clip_grad_norm_ / clip_grad_value_ on three float64 gradients (flattened).\n")
        base = _grads()
        f.write("shapes = [{}]\n".format(", ".join("[" + ", ".join(str(d) for d in s) + "]" for s in SHAPES)))
        f.write("grads = [{}]\n".format(", ".join(
            "[" + ", ".join(_fmt(x) for x in p.grad.flatten().tolist()) + "]" for p in base)))
        for norm_type, max_norm in CASES:
            params = _grads()
            total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
            f.write("\n[[norm_case]]\nnorm_type = {}\nmax_norm = {}\ntotal_norm = {}\n".format(
                _fmt(norm_type), _fmt(max_norm), _fmt(total.item())))
            f.write("clipped = [{}]\n".format(", ".join(
                "[" + ", ".join(_fmt(x) for x in p.grad.flatten().tolist()) + "]" for p in params)))
        params = _grads()
        torch.nn.utils.clip_grad_value_(params, 0.7)
        f.write("\n[value_case]\nclip_value = 0.7\nclipped = [{}]\n".format(", ".join(
            "[" + ", ".join(_fmt(x) for x in p.grad.flatten().tolist()) + "]" for p in params)))
    print("wrote", path)
