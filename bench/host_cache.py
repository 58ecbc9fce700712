#!/usr/bin/env python3
"""Step time, page faults and peak memory of `trainkit train` with and without the host caching allocator
(train.host_cache), runs interleaved: docs/training.md#host-memory.

Usage: bench/host_cache.py [--config configs/fast.toml] [--steps 150] [--rounds 3] [--trainkit BIN]
                           [--set KEY=VALUE ...]
Each round runs every variant once, in turn, for --steps optimizer steps; prints one Markdown table of the
medians over the rounds (ms per step from the run's own step-time line; the process's system CPU seconds,
minor page faults and peak resident memory from wait4). Needs python3 only to run (standard library).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

VARIANTS = [("host_cache = true", "train.host_cache=true"), ("host_cache = false", "train.host_cache=false")]


def run_once(args, override, out):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.trainkit, "train", "--config", args.config, "--out", out, "--set", "train.epochs=1",
           "--set", f"train.max_steps={args.steps}", "--set", override]
    for s in args.set:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"host_cache.py: {' '.join(cmd)} failed:\n{log}")
    m = re.search(r"in (\d+) steps \(([\d.]+) ms/step\)", log)
    if not m:
        sys.exit(f"host_cache.py: no step-time line in the log of {' '.join(cmd)}:\n{log}")
    return {"ms": float(m.group(2)), "sys": usage.ru_stime, "faults": usage.ru_minflt,
            "rss": usage.ru_maxrss / 1024.0}


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=os.path.join(root, "configs/fast.toml"))
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trainkit", default=os.path.join(root, "build/apps/trainkit"))
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args()
    results = {name: [] for name, _ in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, override in VARIANTS:
                results[name].append(run_once(args, override, os.path.join(tmp, "run")))
                print(f"round {r + 1}/{args.rounds} {name}: {results[name][-1]}", file=sys.stderr)
    base = statistics.median(x["ms"] for x in results[VARIANTS[1][0]])
    print(f"{args.config}, {args.steps} steps, median of {args.rounds} interleaved rounds\n")
    print("| variant | ms/step (median) | min-max | vs host_cache = false | system CPU s | minor page faults "
          "| peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for name, _ in VARIANTS:
        xs = results[name]
        ms = [x["ms"] for x in xs]
        med = lambda k: statistics.median(x[k] for x in xs)
        print(f"| {name} | {statistics.median(ms):.1f} | {min(ms):.1f}-{max(ms):.1f} | "
              f"{statistics.median(ms) / base:.2f} | {med('sys'):.2f} | {med('faults'):,.0f} | {med('rss'):,.0f} |")


if __name__ == "__main__":
    main()
