#!/usr/bin/env python3
"""DeepSpeed's CPU Adam as bench_optim's peer, stepped one step per request.

bench_optim (bench/bench_optim.cpp, --deepspeed) starts this program once per case and writes one line
per timed step to its standard input; for each "step" line it runs one DeepSpeedCPUAdam step and answers
with the step's wall time in seconds, so that the peer's steps are interleaved with trainkit's variants
round by round as the in-process variants are. The parameters have the case's shapes (COUNT float32
vectors of TOTAL / COUNT elements, gradients of 1e-3 scale), Adam with lr 1e-3 and no weight decay
(adamw_mode=False: L2 decay, which with weight decay 0 is Adam), float32 state: the configuration of
bench_optim's "trainkit Adam fused" row.

The first "ready" line is written once DeepSpeed's C++ op is built and loaded (it compiles on first use,
into the torch extensions cache) and the optimizer exists; it names DeepSpeed's version and the SIMD
width its op was built for.

Usage: bench_optim_peer.py TOTAL COUNT THREADS
"""
import os
import sys
import time


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    total, count, threads = (int(a) for a in sys.argv[1:])
    # The op's OpenMP loop takes OMP_NUM_THREADS; bench_optim sets it too, this is for direct use.
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)
    try:
        import deepspeed
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except ImportError as e:
        print(f"bench_optim_peer: cannot import deepspeed ({e}); scripts/setup.sh --bench-peers installs it",
              file=sys.stderr)
        return 3

    torch.manual_seed(0)
    params = []
    for _ in range(count):
        p = torch.randn(total // count).requires_grad_()
        p.grad = torch.randn(total // count) * 1e-3
        params.append(p)
    opt = DeepSpeedCPUAdam(params, lr=1e-3, adamw_mode=False, fp32_optimizer_states=True)
    simd = "?"
    try:
        from deepspeed.ops.op_builder import CPUAdamBuilder

        simd = CPUAdamBuilder().simd_width()
    except Exception:  # the width is informative only
        pass
    print(f"ready deepspeed {deepspeed.__version__} {simd.strip() or 'scalar'}", flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        start = time.perf_counter()
        opt.step()
        print(f"{time.perf_counter() - start:.9f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
