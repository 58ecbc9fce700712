#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/seed-*), deterministically.

Usage: python3 scripts/fuzz_corpus.py [--checkpoints NAME=FILE...]   (no third-party modules)

The `checkpoint` target's seeds are checkpoints written by trainkit itself: each FILE becomes two seeds,
the whole file (first byte 1: raw) and its payload alone (first byte 0: the harness adds a valid header).
The committed ones come from one epoch of a 2-unit MLP on 64 images, SGD and Adam:
  trainkit train --config tiny.toml --out sgd     (tiny.toml: data.limit_train = 64, data.val_size = 0,
  trainkit train --config tiny.toml --out adam     model.name = "mlp", model.hidden = 2, train.epochs = 1,
      --set optimizer.name='"adam"'                train.batch_size = 32, optimizer sgd lr 0.1)
"""
import gzip
import json
import pathlib
import re
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fuzz" / "corpus"


def write(target, name, data):
    out = CORPUS / target
    out.mkdir(parents=True, exist_ok=True)
    (out / f"seed-{name}").write_bytes(data if isinstance(data, bytes) else data.encode())


def idx(shape, payload=None):
    count = 1
    for s in shape:
        count *= s
    header = bytes([0, 0, 0x08, len(shape)]) + b"".join(struct.pack(">I", s) for s in shape)
    if payload is None:
        payload = bytes((i * 37 + 11) % 256 for i in range(count))
    return header + payload


def idx_seeds():
    seeds = {
        "labels-10": idx([10], bytes(i % 10 for i in range(10))),
        "images-2x3x3": idx([2, 3, 3]),
        "images-1x4x4x2": idx([1, 4, 4, 2]),
        "empty-0x28x28": idx([0, 28, 28]),
        "truncated": idx([4, 4])[:-3],
        "trailing": idx([2]) + b"\x00",
        "int32-type": bytes([0, 0, 0x0C, 1, 0, 0, 0, 1, 0, 0, 0, 7]),
    }
    for name, data in seeds.items():
        write("idx", name, data)
        write("idx_gz", name, data)  # idx_gz compresses its input itself
    write("idx", "gz-images-2x3x3", gzip.compress(idx([2, 3, 3]), mtime=0))
    write("idx", "gz-labels-10", gzip.compress(seeds["labels-10"], mtime=0))


def cifar_seeds():
    record = 1 + 3 * 32 * 32
    one = bytes([3]) + bytes((i * 7) % 256 for i in range(record - 1))
    two = one + bytes([9]) + bytes((i * 13 + 5) % 256 for i in range(record - 1))
    write("cifar", "one-record", one)
    write("cifar", "two-records", two)
    write("cifar", "bad-label", bytes([10]) + one[1:])
    write("cifar", "truncated", one[:-1])


def fortune_seeds():
    write("fortunes", "three", "A stitch in time\nsaves nine.\n%\nThe early bird gets the worm.\n"
          "\t\t-- Proverb\n%\nDon't panic!<br />It's \"only\" 42.\n%\n")
    write("fortunes", "crlf", "Line one\r\n%\r\nLine two\r\n%\r\n")
    write("fortunes", "empty-records", "%\n%\n\n%\nonly one\n")
    write("fortunes", "no-final-separator", "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 ok\n%\nlast")
    write("fortunes", "specials", "<unk> <pad> <unk>\n%\n<pad>\n")


def scheduler_as_config(text):
    """A schedules/*.toml table (the `schedule` app's format) as the [scheduler] section of a config."""
    text = re.sub(r"^\[\[schedulers\]\]", "[[scheduler.schedulers]]", text, flags=re.M)
    return "[scheduler]\n" + text


def config_seeds():
    configs = sorted((ROOT / "configs").glob("*.toml"))
    for path in configs:
        write("config", path.stem, path.read_text())
    for path in sorted((ROOT / "configs" / "schedules").glob("*.toml")):
        text = scheduler_as_config(path.read_text())
        write("config", "schedule-" + path.stem, text)
        write("factories", "schedule-" + path.stem, text)
    write("config", "with-overrides",
          (ROOT / "configs" / "fashion_mnist.toml").read_text()
          + "\0optimizer.lr=0.01\0train.epochs=2\0scheduler.type=\"StepLR\"\0scheduler.step_size=1")
    write("config", "override-only", "\0model.channels=[8, 16]\0log.every_steps=5\0data.val_size=0")
    optimizers = {
        "adam": 'name = "adam"\nlr = 1e-3\nbetas = [0.9, 0.999]\namsgrad = true\n',
        "adamw": 'name = "adamw"\nlr = 3e-3\nweight_decay = 0.05\nno_decay_1d = true\n',
        "sgd": 'name = "sgd"\nlr = 0.1\nmomentum = 0.9\nnesterov = true\nweight_decay = 5e-4\n',
        "lars": 'name = "lars"\nlr = 0.5\nmomentum = 0.9\ntrust_coefficient = 0.001\n',
        "lamb": 'name = "lamb"\nlr = 0.01\nweight_decay = 0.01\n',
    }
    schedulers = {
        "onecycle": 'type = "OneCycleLR"\nmax_lr = 0.01\n',
        "cyclic": 'type = "CyclicLR"\nbase_lr = 0.001\nmax_lr = 0.01\nstep_size_up = 2\nmode = "exp_range"\ngamma = 0.9\n',
        "plateau": 'type = "ReduceLROnPlateau"\nfactor = 0.5\npatience = 0\n',
        "exp": 'type = "ExponentialLR"\ngamma = 0.9\n',
        "multistep": 'type = "MultiStepLR"\nmilestones = [1, 2]\n',
        "poly": 'type = "PolynomialLR"\ntotal_iters = 3\npower = 2.0\n',
        "constant": 'type = "ConstantLR"\nfactor = 0.5\ntotal_iters = 2\n',
        "chained": 'type = "ChainedScheduler"\n[[scheduler.schedulers]]\ntype = "ExponentialLR"\ngamma = 0.9\n'
                   '[[scheduler.schedulers]]\ntype = "StepLR"\nstep_size = 1\n',
    }
    for (oname, otext), (sname, stext) in zip(optimizers.items(), list(schedulers.items())[:5]):
        write("factories", f"{oname}-{sname}", f"[optimizer]\n{otext}\n[scheduler]\n{stext}")
    for sname, stext in list(schedulers.items())[5:]:
        write("factories", f"sgd-{sname}", f"[optimizer]\n{optimizers['sgd']}\n[scheduler]\n{stext}")
    write("factories", "override", f"[optimizer]\n{optimizers['adam']}\0scheduler.type=\"StepLR\"\0scheduler.step_size=2")


def checkpoint_seeds(specs):
    header = 32  # magic, version, flags, payload size, CRC-32, reserved (libtrainkit/train/checkpoint.h)
    for spec in specs:
        name, path = spec.split("=", 1)
        data = pathlib.Path(path).read_bytes()
        if data[:8] != b"TKCKPT\r\n":
            sys.exit(f"{path}: not a trainkit checkpoint")
        write("checkpoint", f"{name}-raw", b"\x01" + data)
        write("checkpoint", f"{name}-payload", b"\x00" + data[header:])


def safetensors_file(entries, metadata=None, data=None):
    """A safetensors file laid out as the reference writer does: entries are (name, dtype, shape, size)."""
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, size in entries:
        n = size
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    if data is None:
        data = bytes(i & 1 for i in range(offset))
    return struct.pack("<Q", len(text)) + text + data, text


def safetensors_seeds():
    golden = (ROOT / "tests" / "golden" / "interop" / "dtypes.safetensors").read_bytes()
    write("safetensors", "golden-dtypes-raw", b"\x01" + golden)
    write("safetensors", "golden-dtypes-truncated", b"\x01" + golden[:len(golden) // 2])
    entries = [("w", "F64", [2, 3], 8), ("b", "F32", [3], 4), ("h", "BF16", [1, 2], 2), ("m", "BOOL", [4], 1),
               ("e", "I32", [0, 5], 4), ("s", "I64", [], 8)]
    whole, text = safetensors_file(entries, {"format": "pt"})
    write("safetensors", "mixed-raw", b"\x01" + whole)
    data_length = len(whole) - 8 - len(text)
    write("safetensors", "mixed-header", b"\x00" + struct.pack("<H", data_length) + text)
    _, text = safetensors_file([("a", "F32", [2], 4), ("b", "U8", [3], 1)])
    write("safetensors", "hole-header", b"\x00" + struct.pack("<H", 13) + text)
    write("safetensors", "empty-header", b"\x00\x00\x00{}")


def main():
    args = sys.argv[1:]
    if args and args[0] == "--checkpoints":
        checkpoint_seeds(args[1:])
        return
    idx_seeds()
    cifar_seeds()
    fortune_seeds()
    config_seeds()
    safetensors_seeds()


if __name__ == "__main__":
    main()
