#!/usr/bin/env python3
"""Reads TensorBoard event files with TensorBoard's own loader and prints a JSON summary.

Usage: read_tfevents.py PATH   (a log directory, searched recursively, or one event file)

Output: {"runs": {RUN: {"events": N, "migrated_events": M, "file_version": [...],
                        "scalars": {TAG: [[step, value], ...]},
                        "texts": {TAG: [[step, text], ...]},
                        "histograms": {TAG: [[step, min, max, num, sum], ...]},
                        "images": {TAG: [[step, height, width, colorspace, [pixel bytes, HWC]], ...]},
                        "hparams": {"experiment": {"hparams": [[name, type]], "metrics": [tag, ...]},
                                    "session_start": {name: value}, "session_end": status}}}}
where RUN is the directory relative to PATH ("." for PATH itself). Events are decoded from
LegacyEventFileLoader (the raw protos, CRC-checked); EventFileLoader (the read-time compat layers
TensorBoard's UI uses) also runs over every file, and "migrated_events" counts what it yields.
Images are decoded from their PNG bytes by Pillow; hparams are parsed by TensorBoard's hparams plugin
(tensorboard.plugins.hparams.metadata), the hparam values as the plugin reads them from the
google.protobuf.Value (number, string or bool).
Used by trainkit's tests to check trainkit::log::SummaryWriter.
"""

import json
import os
import sys

import io

import numpy as np
from PIL import Image
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader, LegacyEventFileLoader
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata


def event_files(path):
    if os.path.isfile(path):
        yield ".", path
        return
    for dirpath, _, filenames in sorted(os.walk(path)):
        for name in sorted(filenames):
            if "tfevents" in name:
                yield os.path.relpath(dirpath, path), os.path.join(dirpath, name)


def plain(value):
    """A google.protobuf.Value as the hparams plugin uses it."""
    kind = value.WhichOneof("kind")
    return {"number_value": value.number_value, "string_value": value.string_value,
            "bool_value": value.bool_value}.get(kind)


def parse_hparams(tag, content):
    """One of the three hparams summaries, parsed by the plugin's own functions (chosen by tag, as the plugin does)."""
    if tag == hparams_metadata.EXPERIMENT_TAG:
        exp = hparams_metadata.parse_experiment_plugin_data(content)
        return {"experiment": {"hparams": [[h.name, api_pb2.DataType.Name(h.type)] for h in exp.hparam_infos],
                               "metrics": [m.name.tag for m in exp.metric_infos]}}
    if tag == hparams_metadata.SESSION_START_INFO_TAG:
        info = hparams_metadata.parse_session_start_info_plugin_data(content)
        return {"session_start": {k: plain(v) for k, v in sorted(info.hparams.items())}}
    if tag == hparams_metadata.SESSION_END_INFO_TAG:
        info = hparams_metadata.parse_session_end_info_plugin_data(content)
        return {"session_end": api_pb2.Status.Name(info.status)}
    raise ValueError("unknown hparams tag " + tag)


def summarize(path):
    runs = {}
    for run, file_path in event_files(path):
        out = runs.setdefault(run, {"events": 0, "migrated_events": 0, "file_version": [], "scalars": {},
                                    "texts": {}, "histograms": {}, "images": {}, "hparams": {}})
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
                elif kind == "image":
                    img = value.image
                    pixels = Image.open(io.BytesIO(img.encoded_image_string))
                    flat = [int(b) for b in np.asarray(pixels).flatten()]
                    out["images"].setdefault(value.tag, []).append(
                        [event.step, img.height, img.width, img.colorspace, [pixels.height, pixels.width], flat])
                elif value.metadata.plugin_data.plugin_name == hparams_metadata.PLUGIN_NAME:
                    out["hparams"].update(parse_hparams(value.tag, value.metadata.plugin_data.content))
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
