"""Python peer of bench/bench_interop.cpp: loads one file in this process and prints
"load_s sum_s rss_before_mib peak_rss_mib checksum" (the same line as the C++ child).
    .venv/bin/python scripts/bench_interop_peer.py safetensors|pt FILE"""
import sys
import time

import torch
from safetensors.torch import load_file


def status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("/proc/self/status has no " + field)


def main():
    kind, path = sys.argv[1], sys.argv[2]
    rss_before = status_mib("VmRSS")
    start = time.perf_counter()
    tensors = load_file(path) if kind == "safetensors" else torch.load(path, weights_only=True)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    checksum = 0.0
    for tensor in tensors.values():
        checksum += tensor.sum().item()
    sum_s = time.perf_counter() - start
    print("{:.6f} {:.6f} {:.1f} {:.1f} {:.6g}".format(load_s, sum_s, rss_before, status_mib("VmHWM"), checksum))


if __name__ == "__main__":
    main()
