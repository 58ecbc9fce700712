#!/usr/bin/env python3
"""Python peer of bench/bench_trainer: the same CNN, data, data order and optimizer in Python PyTorch.

Prints the seconds its training loop took for --steps steps (after a short warm-up), nothing else.
The data order is trainkit's TensorLoader order: epoch 0 is torch.randperm(n, generator seeded 0).
"""
import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    _, _, ndim = struct.unpack(">HBB", data[:4])
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def make_cnn():
    # trainkit::nn::make_cnn() defaults: channels (32, 64), batch norm, hidden 128, dropout 0.25
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25),
        nn.Linear(128, 10))


def make_mlp():
    # trainkit::nn::make_mlp() defaults: 784 -> 256 -> 10, no dropout
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    args = ap.parse_args()

    images = torch.from_numpy(read_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz")).copy())
    labels = torch.from_numpy(read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz")).copy())
    x = images.unsqueeze(1).float().div_(255.0).sub_(0.2860).div_(0.3530).contiguous()
    y = labels.long()
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    n_batches = (x.shape[0] + args.batch_size - 1) // args.batch_size

    def batch(i):
        idx = order[(i % n_batches) * args.batch_size:(i % n_batches + 1) * args.batch_size]
        return x.index_select(0, idx), y.index_select(0, idx)

    def run(model, opt, steps):
        model.train()
        for i in range(steps):
            xb, yb = batch(i)
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()

    make = make_mlp if args.model == "mlp" else make_cnn
    torch.manual_seed(0)
    warm = make()
    run(warm, torch.optim.Adam(warm.parameters(), lr=1e-3), 20)
    torch.manual_seed(0)
    model = make()
    # foreach=False: LibTorch's Adam is the per-parameter for-loop form; compare like with like.
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    start = time.perf_counter()
    run(model, opt, args.steps)
    print("{:.6f}".format(time.perf_counter() - start))


if __name__ == "__main__":
    main()
