#!/usr/bin/env python3
"""ReLU before or after max pooling in make_cnn's conv blocks: the step time of the same CNN in Python PyTorch
(the pinned wheel), each order in its own process, interleaved round by round
(docs/case_studies.md#where-the-time-went-three-fixes-to-trainkit).

Usage: .venv/bin/python bench/cnn_block_order.py [--rounds 5] [--steps 60] [--threads 2]
The model is configs/fast.toml's former two-block CNN (channels 32, 64, hidden 128, dropout 0.1, batch norm,
channels-last, batch 256, Adam, label smoothing 0.1) on random images; prints one Markdown table.
"""
import argparse
import statistics
import subprocess
import sys

ORDERS = ["relu_then_pool", "pool_then_relu"]


def child(order, steps, threads):
    import time
    import torch
    import torch.nn as nn
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    layers, c = [], 1
    for o in (32, 64):
        block = [nn.Conv2d(c, o, 3, padding=1, bias=False), nn.BatchNorm2d(o)]
        block += [nn.ReLU(), nn.MaxPool2d(2)] if order == "relu_then_pool" else [nn.MaxPool2d(2), nn.ReLU()]
        layers += block
        c = o
    layers += [nn.Flatten(), nn.Dropout(0.1), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.1),
               nn.Linear(128, 10)]
    model = nn.Sequential(*layers).to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    x = torch.randn(256, 1, 28, 28).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (256,))

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(10):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    print((time.perf_counter() - start) / steps * 1000)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", choices=ORDERS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.steps, args.threads)
        return
    ms = {o: [] for o in ORDERS}
    for r in range(args.rounds):
        for o in ORDERS:
            out = subprocess.run([sys.executable, __file__, "--child", o, "--steps", str(args.steps),
                                  "--threads", str(args.threads)], check=True, capture_output=True, text=True)
            ms[o].append(float(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} {o}: {ms[o][-1]:.1f} ms/step", file=sys.stderr)
    base = statistics.median(ms[ORDERS[0]])
    print(f"{args.steps} steps, {args.threads} threads, median of {args.rounds} interleaved rounds\n")
    print("| block order | ms/step (median) | min-max | vs ReLU then pool |")
    print("|---|---|---|---|")
    for o in ORDERS:
        m = statistics.median(ms[o])
        print(f"| {o.replace('_', ' ')} | {m:.1f} | {min(ms[o]):.1f}-{max(ms[o]):.1f} | {m / base:.2f} |")


if __name__ == "__main__":
    main()
