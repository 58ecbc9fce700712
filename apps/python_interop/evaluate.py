#!/usr/bin/env python3
"""Step 3 of apps/python_interop: the model fine-tuned in C++, back in Python.

Loads --dir/finetuned.pt (torch.jit.load) and --dir/finetuned.safetensors (into the Python model class of
pretrain.py), evaluates both on the Fashion-MNIST test set and prints their accuracies; with --expect ACC
(the C++ app's printed test accuracy) it exits 1 unless both agree with it to 1e-4.
    .venv/bin/python apps/python_interop/evaluate.py --dir /tmp/interop [--expect 0.8123]
"""
import argparse
import os
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pretrain import SmallCnn, accuracy, load  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--expect", type=float)
    args = ap.parse_args()
    test_x, test_y = load(args.data_dir, "t10k")
    scripted = torch.jit.load(os.path.join(args.dir, "finetuned.pt"))
    plain = SmallCnn()
    plain.load_state_dict(load_file(os.path.join(args.dir, "finetuned.safetensors")), strict=True)
    results = {"torch.jit.load": accuracy(scripted, test_x, test_y), "safetensors": accuracy(plain, test_x, test_y)}
    for how, acc in results.items():
        print("python: fine-tuned model via {}: test accuracy {:.4f}".format(how, acc))
    if args.expect is not None:
        bad = {how: acc for how, acc in results.items() if abs(acc - args.expect) > 1e-4}
        if bad:
            print("python: expected {:.4f} (the C++ result), got {}".format(args.expect, bad), file=sys.stderr)
            return 1
        print("python: both agree with the C++ test accuracy {:.4f}".format(args.expect))
    return 0


if __name__ == "__main__":
    sys.exit(main())
