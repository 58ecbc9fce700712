#!/usr/bin/env python3
"""Checks that the committed golden files (tests/golden/*.toml) are what scripts/gen_golden.py writes today
with the pinned wheel, on this CPU: it regenerates them into a temporary directory and compares each file's
values with the committed one's. Each number is judged at the precision it was computed in:
- float32 results (a value that is a float32 number on both sides, or a key scripts/golden_common.py
  declares float32-derived): equal within F32_ULPS units in the last place of float32 at the scale of its
  array (its largest magnitude), so that a value near zero that came out of a sum of larger terms is judged
  at the precision of those terms. CPUs with other vector units (AVX2, AVX-512, AMX; MKL's and oneDNN's
  paths) round float32 kernels differently in these bits.
- float64 results: to a relative 1e-9 (BLAS and thread counts move the last digits of a few scikit-learn and
  LAPACK results).
- everything else exactly; files that are not TOML, such as the safetensors and torch.save files under
  interop/, byte for byte, or failing that tensor by tensor (names, dtypes and shapes exactly, values at their
  dtype's precision as above); torch.jit.save files by their tensors.
A golden value edited by hand, a generator changed without regenerating, or a file missing on either side
fails with the file and key. Each TOML file's second line records the CPU it was generated on.

Run with the project's virtual environment (the ctest golden_files_fresh does):
    .venv/bin/python scripts/check_golden.py [--data-dir DIR] [--golden tests/golden] [--regenerated DIR]
    .venv/bin/python scripts/check_golden.py --selftest   (also: a hand-edited value fails, an ulp passes)
The ctest golden_files_fresh_other_isa runs it with ATEN_CPU_CAPABILITY=default and DNNL_MAX_CPU_ISA=SSE41,
standing in for a CPU other than the one the files were generated on, with --selftest.
"""
import argparse
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
from golden_common import FLOAT32_DERIVED

REL_TOL = 1e-9
ABS_TOL = 1e-12
# A float32 result may move by this many float32 ulps (at its array's scale) between CPUs. Measured here:
# up to 12 with ATen's kernels forced from AVX-512 to the scalar default (amp.toml, nn.toml's trunc_normal_),
# 2 on an Intel Xeon against the AMD EPYC that wrote the files. The consuming tests' own tolerances are wider
# (e.g. tests/amp/test_grad_scaler.cpp: allclose(1e-5, 1e-6)).
F32_ULPS = 16


def _load_tensors(path):
    """The tensors of a torch.jit.save, torch.save (weights only) or safetensors file by name, with the
    safetensors header's metadata as one more entry."""
    import warnings
    import torch
    if path.endswith(".torchscript.pt"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit.load's deprecation notice
            return dict(torch.jit.load(path).state_dict())
    if path.endswith(".safetensors"):
        from safetensors import safe_open
        with safe_open(path, framework="pt") as f:
            out = {key: f.get_tensor(key) for key in f.keys()}
            out["(metadata)"] = f.metadata()
        return out
    return _flatten(torch.load(path, weights_only=True))


def _flatten(obj, prefix=""):
    """A torch.load object as one level of name -> leaf: nested dicts, lists and tuples (an optimizer's
    state_dict) under dotted names ("state.0.exp_avg", "param_groups.1.lr")."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)) and prefix:
        items = enumerate(obj)
    else:
        return {prefix: obj} if prefix else dict(obj)
    out = {}
    for key, value in items:
        out.update(_flatten(value, "{}{}".format(prefix + "." if prefix else "", key)))
    return out


def _tensor_differences(want_path, got_path):
    """Lines naming each tensor of two tensor files that differs: names, dtypes and shapes exactly, integer
    tensors exactly, floating-point ones within F32_ULPS units of their dtype's precision at the tensor's
    scale (float64 to a relative 1e-9). The bytes are compared first: equal files need no loading. A
    torch.jit.save file lists constants in set order and its .data/serialization_id is random, so its bytes
    never equal; the values of tensors computed or drawn in float32 move in their last bits between CPUs."""
    with open(want_path, "rb") as a, open(got_path, "rb") as b:
        if a.read() == b.read():
            return []
    import torch
    want, got = _load_tensors(want_path), _load_tensors(got_path)
    out = []
    for key in sorted(set(want) | set(got)):
        if key not in want or key not in got:
            out.append("{}: {}".format(key, "committed, not regenerated" if key not in got else "regenerated, not committed"))
            continue
        w, g = want[key], got[key]
        if w is None or g is None:
            if w is not g:
                out.append("{}: committed {!r}, regenerated {!r}".format(key, w, g))
        elif not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
            if w != g:
                out.append("{}: committed {!r}, regenerated {!r}".format(key, w, g))
        elif w.dtype != g.dtype or w.shape != g.shape:
            out.append("{}: committed {} {}, regenerated {} {}".format(key, w.dtype, list(w.shape), g.dtype, list(g.shape)))
        elif not w.is_floating_point():
            if not torch.equal(w, g):
                out.append("{}: the values differ".format(key))
        elif w.dtype == torch.float64:
            if not torch.allclose(w, g, rtol=REL_TOL, atol=ABS_TOL, equal_nan=True):
                out.append("{}: the values differ by up to {:.3g}".format(key, (w - g).abs().max().item()))
        elif w.numel() > 0:
            w64, g64 = w.double(), g.double()
            scale = torch.maximum(w64.abs().max(), g64.abs().max()).item()
            tol = F32_ULPS * torch.finfo(w.dtype).eps * scale
            if not torch.allclose(w64, g64, rtol=0.0, atol=tol, equal_nan=True):
                out.append("{}: the values differ by up to {:.3g} (allowed {:.3g})".format(
                    key, (w64 - g64).abs().max().item(), tol))
    return out


def _is_float32(x):
    """True when the number is a float32 value (exactly representable; every float32 is a double)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) \
        and float(struct.unpack("f", struct.pack("f", x))[0]) == x


def _float32_ulp(x):
    """The spacing of float32 numbers at magnitude |x| (the smallest subnormal spacing at 0)."""
    x = abs(x)
    if x < 2.0 ** -126:
        return 2.0 ** -149
    return 2.0 ** (math.floor(math.log2(x)) - 23)


def _scale(values):
    """The largest finite magnitude among the numbers of a list (0 when there is none)."""
    nums = [abs(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return max(nums, default=0.0)


# safetensors dtype names of the hex-encoded tensors whose numbers check_golden reads: struct formats.
_HEX_FORMATS = {"F32": "f", "F64": "d"}


def _hex_values(text, dtype):
    """The little-endian numbers of a hex string (a tensor's raw bytes), or the string when it is malformed."""
    size = struct.calcsize(_HEX_FORMATS[dtype])
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return text
    if len(raw) % size:
        return text
    return list(struct.unpack("<{}{}".format(len(raw) // size, _HEX_FORMATS[dtype]), raw))


def _pattern(path):
    """A key path with every array index written "[]", as FLOAT32_DERIVED names them."""
    return re.sub(r"\[\d+\]", "[]", path)


class _All(frozenset):
    """A set that holds every key path: the values under a declared float32-derived key."""
    def __contains__(self, item):
        return True


_ALL = _All()


def _numbers_differ(want, got, path, scale, float32_paths):
    """Whether two numbers differ beyond the precision they were computed in (see the module's docs)."""
    if want == got or (isinstance(want, float) and isinstance(got, float) and math.isnan(want) and math.isnan(got)):
        return False
    if not (math.isfinite(want) and math.isfinite(got)):
        return True
    if _pattern(path) in float32_paths or (_is_float32(want) and _is_float32(got)):
        return abs(want - got) > F32_ULPS * _float32_ulp(max(scale, abs(want), abs(got)))
    return not math.isclose(want, got, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def differences(want, got, path, out, float32_paths=frozenset(), scale=0.0, seen=None):
    """Appends 'path: committed X, regenerated Y' lines for every value that differs. `float32_paths`: the
    key paths (indices as "[]") judged at float32 precision although stored as float64, with everything
    under them; `seen` collects the patterns of the paths visited (to find declarations that name nothing)."""
    if seen is not None:
        seen.add(_pattern(path))
    if path and _pattern(path) in float32_paths:
        float32_paths = _ALL
    if isinstance(want, dict) and isinstance(got, dict):
        if want.get("dtype") == got.get("dtype") in _HEX_FORMATS and isinstance(want.get("hex"), str) \
                and isinstance(got.get("hex"), str) and want["hex"] != got["hex"]:
            # A tensor's raw bytes in hex (interop.toml): compared as the numbers they hold.
            want, got = dict(want), dict(got)
            want["hex"], got["hex"] = _hex_values(want["hex"], want["dtype"]), _hex_values(got["hex"], got["dtype"])
        for key in sorted(set(want) | set(got)):
            sub = "{}.{}".format(path, key) if path else key
            if key not in got:
                out.append("{}: committed, not regenerated".format(sub))
            elif key not in want:
                out.append("{}: regenerated, not committed".format(sub))
            else:
                differences(want[key], got[key], sub, out, float32_paths, 0.0, seen)
    elif isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            out.append("{}: {} values committed, {} regenerated".format(path, len(want), len(got)))
            return
        inner = max(_scale(want), _scale(got))
        for i, (w, g) in enumerate(zip(want, got)):
            differences(w, g, "{}[{}]".format(path, i), out, float32_paths, inner, seen)
    elif isinstance(want, float) or isinstance(got, float):
        if isinstance(want, bool) or isinstance(got, bool) or not isinstance(want, (int, float)) \
                or not isinstance(got, (int, float)):
            out.append("{}: committed {!r}, regenerated {!r}".format(path, want, got))
        elif _numbers_differ(want, got, path, scale, float32_paths):
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


def compare(golden, fresh):
    """The problems of the committed golden directory against a regenerated one, one line each."""
    committed = _files(golden)
    regenerated = _files(fresh)
    problems = []
    for name in sorted(committed - regenerated):
        problems.append("{}: committed, but gen_golden.py no longer writes it".format(name))
    for name in sorted(regenerated - committed):
        problems.append("{}: written by gen_golden.py, not committed".format(name))
    for name in sorted(FLOAT32_DERIVED):
        if name not in committed:
            problems.append("{}: named in golden_common.FLOAT32_DERIVED, but not a golden file".format(name))
    for name in sorted(committed & regenerated):
        if name.endswith((".pt", ".safetensors")):
            problems.extend("{}: {}".format(name, line) for line in
                            _tensor_differences(os.path.join(golden, name), os.path.join(fresh, name)))
            continue
        if not name.endswith(".toml"):  # other files (an Optuna journal): byte for byte
            with open(os.path.join(golden, name), "rb") as a, open(os.path.join(fresh, name), "rb") as b:
                if a.read() != b.read():
                    problems.append("{}: the bytes differ from the regenerated file".format(name))
            continue
        with open(os.path.join(golden, name), "rb") as f:
            first = f.readline().decode()
            want = tomllib.loads(first + f.read().decode())
        if "@generated" not in first:
            problems.append("{}: the first line lacks the @generated mark".format(name))
        with open(os.path.join(fresh, name), "rb") as f:
            got = tomllib.load(f)
        found = []
        seen = set()
        declared = frozenset(FLOAT32_DERIVED.get(name, []))
        differences(want, got, "", found, declared, 0.0, seen)
        for pattern in sorted(declared - seen):
            found.append("{}: declared float32-derived in golden_common.FLOAT32_DERIVED, but no such key".format(pattern))
        problems.extend("{}: {}".format(name, line) for line in found[:10])
        if len(found) > 10:
            problems.append("{}: ... {} more".format(name, len(found) - 10))
    return problems


def _first_number(table, want_float32):
    """The key path and value of the first non-zero float in a parsed TOML table that is (or is not) a
    float32 number."""
    def walk(node, path):
        if isinstance(node, dict):
            for key in node:
                hit = walk(node[key], "{}.{}".format(path, key) if path else key)
                if hit:
                    return hit
        elif isinstance(node, list):
            for i, v in enumerate(node):
                hit = walk(v, "{}[{}]".format(path, i))
                if hit:
                    return hit
        elif isinstance(node, float) and math.isfinite(node) and node != 0 and _is_float32(node) == want_float32:
            return path, node
        return None
    return walk(table, "")


def _edited_copy(golden, scratch, name, want_float32, factor):
    """Copies the golden directory to `scratch` and multiplies the first float32 (or float64) value of `name`
    by `factor` there, as a hand edit would; returns the edited key path."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(golden, scratch)
    path = os.path.join(scratch, name)
    with open(path) as f:
        text = f.read()
    key, value = _first_number(tomllib.loads(text), want_float32)
    edited = value * factor
    if want_float32:
        edited = float(struct.unpack("f", struct.pack("f", edited))[0])
    assert repr(value) in text and edited != value, (name, key, value)
    with open(path, "w") as f:
        f.write(text.replace(repr(value), repr(edited), 1))
    return key


def selftest(golden, fresh):
    """Hand edits of the committed files against the regeneration: a float32 value moved by 1e-4 of itself
    and a float64 value moved by 1e-7 of itself must fail, naming file and key; a float32 value moved by one
    ulp must pass. Returns the problems (empty when the checker behaves)."""
    problems = []
    with tempfile.TemporaryDirectory(prefix="trainkit-golden-edit-") as scratch_root:
        scratch = os.path.join(scratch_root, "golden")
        cases = [("amp.toml", True, 1 + 1e-4, True), ("schedulers.toml", False, 1 + 1e-7, True),
                 ("amp.toml", True, 1 + 2.0 ** -23, False)]
        for name, float32, factor, must_fail in cases:
            key = _edited_copy(golden, scratch, name, float32, factor)
            found = [p for p in compare(scratch, fresh) if p.startswith(name + ": " + key)]
            verdict = "failed" if found else "passed"
            print("check_golden --selftest: {} {} value {} x {!r}: {}".format(
                name, "float32" if float32 else "float64", key, factor, verdict))
            if bool(found) != must_fail:
                problems.append("selftest: editing {} {} by a factor {!r} {} the check".format(
                    name, key, factor, verdict))
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--golden", default=os.path.join(HERE, "..", "tests", "golden"))
    ap.add_argument("--regenerated", help="compare with this directory instead of regenerating")
    ap.add_argument("--selftest", action="store_true", help="also check that hand edits fail and an ulp passes")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainkit-golden-") as scratch:
        fresh = args.regenerated
        if fresh is None:
            fresh = scratch
            run = subprocess.run([sys.executable, os.path.join(HERE, "gen_golden.py"), "--data-dir", args.data_dir,
                                  "--out", fresh], capture_output=True, text=True)
            if run.returncode != 0:
                print(run.stdout + run.stderr, file=sys.stderr)
                print("check_golden: scripts/gen_golden.py failed (exit {})".format(run.returncode), file=sys.stderr)
                return 1
        problems = compare(args.golden, fresh)
        if problems:
            print("check_golden: the committed golden files differ from what scripts/gen_golden.py writes now "
                  "(regenerate with .venv/bin/python scripts/gen_golden.py, never edit them by hand):", file=sys.stderr)
            for line in problems:
                print("  " + line, file=sys.stderr)
            return 1
        with open(os.path.join(fresh, "amp.toml")) as f:
            f.readline()
            where = f.readline().strip()
        print("check_golden: {} golden files equal their regeneration ({})".format(len(_files(args.golden)), where))
        if args.selftest:
            problems = selftest(args.golden, fresh)
            for line in problems:
                print("check_golden: " + line, file=sys.stderr)
            return 1 if problems else 0
        return 0


if __name__ == "__main__":
    sys.exit(main())
