#!/usr/bin/env python3
"""Reads TensorBoard event files with TensorBoard's own loader and prints a JSON summary.

Usage: read_tfevents.py PATH   (a log directory, searched recursively, or one event file)

Output: {"runs": {RUN: {"events": N, "migrated_events": M, "file_version": [...],
                        "scalars": {TAG: [[step, value], ...]},
                        "texts": {TAG: [[step, text], ...]},
                        "histograms": {TAG: [[step, min, max, num, sum], ...]}}}}
where RUN is the directory relative to PATH ("." for PATH itself). Events are decoded from
LegacyEventFileLoader (the raw protos, CRC-checked); EventFileLoader (the read-time compat layers
TensorBoard's UI uses) also runs over every file, and "migrated_events" counts what it yields.
Used by trainkit's tests to check trainkit::log::SummaryWriter.
"""

import json
import os
import sys

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader, LegacyEventFileLoader


def event_files(path):
    if os.path.isfile(path):
        yield ".", path
        return
    for dirpath, _, filenames in sorted(os.walk(path)):
        for name in sorted(filenames):
            if "tfevents" in name:
                yield os.path.relpath(dirpath, path), os.path.join(dirpath, name)


def summarize(path):
    runs = {}
    for run, file_path in event_files(path):
        out = runs.setdefault(run, {"events": 0, "migrated_events": 0, "file_version": [], "scalars": {},
                                    "texts": {}, "histograms": {}})
        for event in LegacyEventFileLoader(file_path).Load():
            out["events"] += 1
            if event.file_version:
                out["file_version"].append(event.file_version)
            for value in event.summary.value:
                kind = value.WhichOneof("value")
                if kind == "simple_value":
                    out["scalars"].setdefault(value.tag, []).append([event.step, value.simple_value])
                elif kind == "histo":
                    h = value.histo
                    out["histograms"].setdefault(value.tag, []).append([event.step, h.min, h.max, h.num, h.sum])
                elif kind == "tensor" and value.metadata.plugin_data.plugin_name == "text":
                    texts = [s.decode("utf-8") for s in value.tensor.string_val]
                    out["texts"].setdefault(value.tag, []).append([event.step, "\n".join(texts)])
        out["migrated_events"] += sum(1 for _ in EventFileLoader(file_path).Load())
    return {"runs": runs}


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    json.dump(summarize(argv[1]), sys.stdout, separators=(",", ":"), sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
