"""Golden values for trainkit::nn::init (torch.nn.init), written by scripts/gen_golden.py.

Every case seeds torch.manual_seed(seed), makes a float32 tensor of `shape` and calls the initializer; the
C++ test does the same with torch::manual_seed and compares every value. The CPU generator and the
normal_/uniform_ kernels are the same library on both sides, so the streams agree.
"""
import math
import os

import torch

SHAPES = {"linear": [5, 7], "conv": [4, 3, 3, 3], "tall": [6, 4], "wide": [3, 8], "conv_wide": [2, 3, 2, 2]}

# (initializer, shape, keyword arguments); "mode"/"nonlinearity" as torch.nn.init spells them.
CASES = [
    ("uniform_", "linear", {"a": -0.5, "b": 2.0}),
    ("normal_", "linear", {"mean": 0.5, "std": 2.0}),
    ("trunc_normal_", "conv", {}),
    ("trunc_normal_", "linear", {"mean": 1.0, "std": 0.5, "a": 0.0, "b": 1.5}),
    ("trunc_normal_", "conv", {"mean": 0.0, "std": 1.0, "a": 2.0, "b": 3.0}),  # rejection-sampling branch
    ("constant_", "linear", {"val": 0.3}),
    ("zeros_", "linear", {}),
    ("ones_", "linear", {}),
    ("kaiming_normal_", "linear", {}),
    ("kaiming_normal_", "conv", {"a": 0.2, "mode": "fan_out", "nonlinearity": "leaky_relu"}),
    ("kaiming_normal_", "conv", {"mode": "fan_in", "nonlinearity": "relu"}),
    ("kaiming_normal_", "linear", {"nonlinearity": "linear"}),  # LeCun normal
    ("kaiming_normal_", "linear", {"nonlinearity": "tanh"}),
    ("kaiming_uniform_", "linear", {}),
    ("kaiming_uniform_", "linear", {"a": math.sqrt(5.0)}),  # LibTorch's default for Linear/Conv weights
    ("kaiming_uniform_", "conv", {"mode": "fan_out", "nonlinearity": "relu"}),
    ("xavier_normal_", "conv", {}),
    ("xavier_uniform_", "linear", {"gain": 5.0 / 3}),
    ("orthogonal_", "tall", {}),
    ("orthogonal_", "wide", {"gain": 2.0}),
    ("orthogonal_", "conv_wide", {}),
]

GAINS = [("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None), ("relu", None),
         ("leaky_relu", None), ("leaky_relu", 0.2), ("selu", None)]


def _fmt(x):
    return repr(float(x))


def gen_nn(out_dir, header, toml_value):
    path = os.path.join(out_dir, "nn.toml")
    with open(path, "w") as f:
        f.write(header)
        f.write("# torch.nn.init on float32 tensors after torch.manual_seed(seed); values flattened.\n")
        f.write("\n[gain]\nnonlinearity = {}\nparam = {}\nvalue = {}\n".format(
            toml_value([n for n, _ in GAINS]), toml_value([-1.0 if p is None else p for _, p in GAINS]),
            toml_value([float(torch.nn.init.calculate_gain(n, p)) for n, p in GAINS])))
        for i, (name, shape_name, kwargs) in enumerate(CASES):
            seed = 100 + i
            torch.manual_seed(seed)
            t = torch.empty(SHAPES[shape_name], dtype=torch.float32)
            getattr(torch.nn.init, name)(t, **kwargs)
            f.write("\n[[case]]\ninit = {}\nseed = {}\nshape = {}\n".format(
                toml_value(name), seed, toml_value(SHAPES[shape_name])))
            for k, v in kwargs.items():
                f.write("{} = {}\n".format(k, toml_value(v)))
            f.write("values = [{}]\n".format(", ".join(_fmt(x) for x in t.flatten().tolist())))
    print("wrote", path)
