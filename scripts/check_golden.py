#!/usr/bin/env python3
"""Checks that the committed golden files (tests/golden/*.toml) are what scripts/gen_golden.py writes today
with the pinned wheel: it regenerates them into a temporary directory and compares each file's values with
the committed one's (numbers to a relative 1e-9: BLAS and thread counts move the last digits of a few
scikit-learn and LAPACK results; everything else exactly; files that are not TOML, such as the safetensors
and torch.save files under interop/, byte for byte; torch.jit.save files by their tensors, to float32's last bits:
the trained one is a GEMM result, and CPUs with other vector units round it differently). A golden value edited by hand, a generator
changed without regenerating, or a file missing on either side fails with the file and key.

Run with the project's virtual environment (the ctest golden_files_fresh does):
    .venv/bin/python scripts/check_golden.py [--data-dir DIR] [--golden tests/golden]
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
REL_TOL = 1e-9
ABS_TOL = 1e-12


def _script_differences(want_path, got_path):
    """Lines naming each tensor of a torch.jit.save file that differs from the other file's: names, dtypes and
    shapes exactly, values to a relative 1e-5 (absolute 1e-7). The file's code lists constants in set order
    and .data/serialization_id is random, so the bytes are not compared; the values of a model trained in
    float32 move by an ulp between CPUs (AVX2 and AVX-512 GEMM kernels round differently)."""
    import warnings
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.load's deprecation notice
        want = torch.jit.load(want_path).state_dict()
        got = torch.jit.load(got_path).state_dict()
    out = []
    for key in sorted(set(want) | set(got)):
        if key not in got or key not in want:
            out.append("{}: {}".format(key, "committed, not regenerated" if key not in got else "regenerated, not committed"))
        elif want[key].dtype != got[key].dtype or want[key].shape != got[key].shape:
            out.append("{}: committed {} {}, regenerated {} {}".format(key, want[key].dtype, list(want[key].shape),
                                                                       got[key].dtype, list(got[key].shape)))
        elif not torch.allclose(want[key], got[key], rtol=1e-5, atol=1e-7):
            out.append("{}: the values differ by up to {:.3g}".format(key, (want[key] - got[key]).abs().max().item()))
    return out


def differences(want, got, path, out):
    """Appends 'path: committed X, regenerated Y' lines for every value that differs."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got)):
            sub = "{}.{}".format(path, key) if path else key
            if key not in got:
                out.append("{}: committed, not regenerated".format(sub))
            elif key not in want:
                out.append("{}: regenerated, not committed".format(sub))
            else:
                differences(want[key], got[key], sub, out)
    elif isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            out.append("{}: {} values committed, {} regenerated".format(path, len(want), len(got)))
            return
        for i, (w, g) in enumerate(zip(want, got)):
            differences(w, g, "{}[{}]".format(path, i), out)
    elif isinstance(want, float) or isinstance(got, float):
        if isinstance(want, bool) or isinstance(got, bool) or not isinstance(want, (int, float)) \
                or not isinstance(got, (int, float)):
            out.append("{}: committed {!r}, regenerated {!r}".format(path, want, got))
        elif not (math.isclose(want, got, rel_tol=REL_TOL, abs_tol=ABS_TOL)
                  or (math.isnan(want) and math.isnan(got))):
            out.append("{}: committed {!r}, regenerated {!r}".format(path, want, got))
    elif want != got or type(want) is not type(got):
        out.append("{}: committed {!r}, regenerated {!r}".format(path, want, got))


def _files(root):
    """Every file under `root`, as paths relative to it."""
    out = set()
    for folder, _, names in os.walk(root):
        for name in names:
            out.add(os.path.relpath(os.path.join(folder, name), root))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--golden", default=os.path.join(HERE, "..", "tests", "golden"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainkit-golden-") as fresh:
        run = subprocess.run([sys.executable, os.path.join(HERE, "gen_golden.py"), "--data-dir", args.data_dir,
                              "--out", fresh], capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout + run.stderr, file=sys.stderr)
            print("check_golden: scripts/gen_golden.py failed (exit {})".format(run.returncode), file=sys.stderr)
            return 1
        committed = _files(args.golden)
        regenerated = _files(fresh)
        problems = []
        for name in sorted(committed - regenerated):
            problems.append("{}: committed, but gen_golden.py no longer writes it".format(name))
        for name in sorted(regenerated - committed):
            problems.append("{}: written by gen_golden.py, not committed".format(name))
        for name in sorted(committed & regenerated):
            if name.endswith(".torchscript.pt"):
                problems.extend("{}: {}".format(name, line) for line in
                                _script_differences(os.path.join(args.golden, name), os.path.join(fresh, name)))
                continue
            if not name.endswith(".toml"):  # binary interchange files: byte for byte
                with open(os.path.join(args.golden, name), "rb") as a, open(os.path.join(fresh, name), "rb") as b:
                    if a.read() != b.read():
                        problems.append("{}: the bytes differ from the regenerated file".format(name))
                continue
            with open(os.path.join(args.golden, name), "rb") as f:
                first = f.readline().decode()
                want = tomllib.loads(first + f.read().decode())
            if "@generated" not in first:
                problems.append("{}: the first line lacks the @generated mark".format(name))
            with open(os.path.join(fresh, name), "rb") as f:
                got = tomllib.load(f)
            found = []
            differences(want, got, "", found)
            problems.extend("{}: {}".format(name, line) for line in found[:10])
            if len(found) > 10:
                problems.append("{}: ... {} more".format(name, len(found) - 10))
        if problems:
            print("check_golden: the committed golden files differ from what scripts/gen_golden.py writes now "
                  "(regenerate with .venv/bin/python scripts/gen_golden.py, never edit them by hand):", file=sys.stderr)
            for line in problems:
                print("  " + line, file=sys.stderr)
            return 1
        print("check_golden: {} golden files equal their regeneration".format(len(committed)))
        return 0


if __name__ == "__main__":
    sys.exit(main())
