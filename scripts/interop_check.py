"""Checks, with Python's own readers, the weights files that trainkit's C++ test wrote (run by the ctest
`interop_read_by_python` through tests/io/test_interop_python.cpp).

Usage: .venv/bin/python scripts/interop_check.py DIR   (DIR holds manifest.json and the files it names)
  - every tensor of manifest["tensors"]["expected"] (dtype, shape, raw bytes in hex), as read by
    safetensors.torch.load_file and by torch.load(weights_only=True), bitwise; the safetensors metadata;
  - every model of manifest["models"]: the Python twin (scripts/golden_interop.py) loads the state_dict
    from both files strictly, the two agree bitwise, and in eval mode the twin's logits on the saved input
    are within 1e-6 of the C++ logits.
Prints one line per check; exits non-zero at the first failure.
"""
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_interop import SAFETENSORS_DTYPES, cifar_resnet, cnn, raw_hex  # noqa: E402

TOLERANCE = 1e-6


def check_tensors(what, got, expected):
    assert isinstance(got, dict), "{}: a {}, not a dict".format(what, type(got).__name__)
    assert sorted(got) == sorted(expected), "{}: keys {} != {}".format(what, sorted(got), sorted(expected))
    for name, e in expected.items():
        t = got[name]
        assert isinstance(t, torch.Tensor), "{}: '{}' is a {}".format(what, name, type(t).__name__)
        assert SAFETENSORS_DTYPES[t.dtype] == e["dtype"], "{}: '{}' dtype {}".format(what, name, t.dtype)
        assert list(t.shape) == e["shape"], "{}: '{}' shape {}".format(what, name, list(t.shape))
        assert raw_hex(t) == e["hex"], "{}: '{}' bytes differ".format(what, name)
    print("ok: {}: {} tensors bitwise equal".format(what, len(expected)))


def build(kind, options):
    if kind == "cnn":
        return cnn(**options)
    if kind == "cifar_resnet":
        return cifar_resnet(**options)
    raise ValueError(kind)


def check_model(folder, m):
    from_st = load_file(os.path.join(folder, m["safetensors"]))
    from_pt = torch.load(os.path.join(folder, m["pt"]), weights_only=True)
    assert list(from_st) == list(from_pt) or sorted(from_st) == sorted(from_pt), "{}: keys differ".format(m["name"])
    for k in from_st:
        assert raw_hex(from_st[k]) == raw_hex(from_pt[k]), "{}: '{}' differs between the files".format(m["name"], k)
    io = load_file(os.path.join(folder, m["io"]))
    for source, state in (("safetensors", from_st), ("torch.load", from_pt)):
        model = build(m["kind"], m["options"])
        model.load_state_dict(state, strict=True)
        model.eval()
        with torch.no_grad():
            logits = model(io["input"])
        diff = (logits - io["logits"]).abs().max().item()
        assert diff <= TOLERANCE, "{} via {}: max |logit difference| {} > {}".format(m["name"], source, diff, TOLERANCE)
        print("ok: {} via {}: {} tensors, max |logit difference| {:.3g}".format(m["name"], source, len(state), diff))


def main():
    folder = sys.argv[1]
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    t = manifest["tensors"]
    check_tensors("safetensors.torch.load_file", load_file(os.path.join(folder, t["safetensors"])), t["expected"])
    with safe_open(os.path.join(folder, t["safetensors"]), framework="pt") as f:
        assert f.metadata() == t["metadata"], "metadata {} != {}".format(f.metadata(), t["metadata"])
    print("ok: safetensors metadata")
    check_tensors("torch.load(weights_only=True)", torch.load(os.path.join(folder, t["pt"]), weights_only=True),
                  t["expected"])
    for m in manifest["models"]:
        check_model(folder, m)


if __name__ == "__main__":
    main()
