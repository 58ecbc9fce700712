#!/usr/bin/env python3
"""Step 1 of apps/python_interop: a model written and pretrained in Python, exported for C++.

Pretrains a small CNN on the first --limit-train Fashion-MNIST training images (one epoch, SGD), prints its
test accuracy, and writes --out/pretrained.pt (torch.jit.script + torch.jit.save), which the C++ app
fine-tunes. Run with the project's virtual environment:
    .venv/bin/python apps/python_interop/pretrain.py --out /tmp/interop
"""
import argparse
import gzip
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MEAN, STD = 0.2860, 0.3530  # trainkit::data::kFashionMnistMean/Std: the C++ app normalizes the same way


class SmallCnn(nn.Module):
    """conv(1->8) -> pool -> conv(8->16) -> pool -> linear(784->10); children in layer order, as
    trainkit's optim::child_layer_ids reads them for layer-wise LR decay."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


def read_idx_gz(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    _, _, ndim = struct.unpack(">HBB", data[:4])
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(data_dir, split, limit=0):
    x = torch.from_numpy(read_idx_gz(os.path.join(data_dir, split + "-images-idx3-ubyte.gz")).copy())
    y = torch.from_numpy(read_idx_gz(os.path.join(data_dir, split + "-labels-idx1-ubyte.gz")).astype(np.int64))
    if limit > 0:
        x, y = x[:limit], y[:limit]
    return x.reshape(-1, 1, 28, 28).to(torch.float32).div_(255.0).sub_(MEAN).div_(STD), y


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        correct = sum((model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item() for i in range(0, len(y), 1000))
    return correct / len(y)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--limit-train", type=int, default=2000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    x, y = load(args.data_dir, "train", args.limit_train)
    test_x, test_y = load(args.data_dir, "t10k")
    model = SmallCnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    order = torch.randperm(len(y))
    for b in range(0, len(y), 64):
        idx = order[b:b + 64]
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    print("python: pretrained on {} images, test accuracy {:.4f}".format(len(y), accuracy(model, test_x, test_y)))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "pretrained.pt")
    torch.jit.save(torch.jit.script(model), path)
    print("python: wrote", path)


if __name__ == "__main__":
    main()
