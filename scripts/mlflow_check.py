#!/usr/bin/env python3
"""A `trainkit train` run logs to a real MLflow tracking server, which is killed and restarted while the run
trains; MLflow's own Python client then reads back what the server holds (run by the ctest
mlflow_server_receives_run).

    .venv/bin/python scripts/mlflow_check.py probe        exit 0 when mlflow is importable
    .venv/bin/python scripts/mlflow_check.py run --cli build/apps/trainkit --data-dir DIR [--work DIR]

`run` starts `mlflow server` (SQLite backend, artifacts served by the server) on 127.0.0.1 at a free port,
starts `trainkit train` with log.mlflow_uri pointing at it, SIGKILLs the server once the MLflow run exists
and the run has written ten metric rows, lets the run write ten more without a server, restarts the server on the
same port and database (holding trainkit with SIGSTOP meanwhile, so that it is still running when the server
is back), and waits for the run to end. It then checks,
through mlflow.MlflowClient: the run is FINISHED; its params are the run's effective config.toml, flat, each
value equal (strings, numbers, bools and lists alike);
its tags name the trainkit version and world size; every row of the run's metrics.jsonl is there as
MLflow metrics with the same values and steps (train/loss, val/accuracy, ...); config.toml, metrics.csv,
curves.svg, summary.json and the exported model.safetensors are its artifacts, summary.json byte for byte.
Exit 0 when all hold, 1 with the differences.
"""
import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request

CONFIG = """
[data]
dir = "{data_dir}"
val_size = 100
limit_train = 1000
limit_test = 200
[model]
channels = [4, 8]
hidden = 16
[optimizer]
name = "adamw"
lr = 0.003
[train]
epochs = 24
batch_size = 20
seed = 3
threads = 1
[checkpoint]
export = ["safetensors"]
[log]
every_steps = 1
progress = "lines"
mlflow_uri = "{uri}"
mlflow_experiment = "trainkit-ctest"
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(work, port):
    log = open(os.path.join(work, "server.log"), "ab")
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", "sqlite:///" + os.path.join(work, "mlflow.db"),
           "--artifacts-destination", os.path.join(work, "artifacts"), "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("mlflow server exited ({}); see {}".format(proc.returncode, log.name))
        try:
            with urllib.request.urlopen("http://127.0.0.1:{}/health".format(port), timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("mlflow server did not answer within 180 s; see " + log.name)


def kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def expected_metrics(row, val_metrics):
    """trainkit::log::mlflow_metrics for one metrics.jsonl row: [(key, value, step)]."""
    fixed = {"kind", "step", "epoch", "loss", "lr", "samples_per_second", "val_loss"}
    out = []
    step = row["step"]
    if row["kind"] == "train":
        for name in ("loss", "lr", "samples_per_second"):
            if row.get(name) is not None:
                out.append(("train/" + name, row[name], step))
        for name, value in row.items():
            if name not in fixed and value is not None:
                out.append(("train/" + name, value, step))
    else:
        prefix = "test/" if row["kind"] == "test" else "val/"
        if row.get("loss") is not None:
            out.append(("epoch/train_loss", row["loss"], step))
        if row.get("val_loss") is not None:
            out.append((prefix + "loss", row["val_loss"], step))
        for name, value in row.items():
            if name in fixed or value is None:
                continue
            metric = name[len("val_"):] if name.startswith("val_") and name[len("val_"):] in val_metrics else None
            out.append((prefix + metric if metric else name, value, step))
    return out


def flat(table, prefix=""):
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(flat(value, prefix + key + "."))
        else:
            out[prefix + key] = value
    return out


def same_value(got, want):
    """Whether a param read back equals the config's value: bools and strings exactly, numbers to a relative
    1e-12, lists element by element (and of the same length)."""
    if isinstance(want, bool) or isinstance(got, bool) or isinstance(want, str):
        return type(got) is type(want) and got == want
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(same_value(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and all(same_value(got[k], want[k]) for k in want)
    return isinstance(got, (int, float)) and math.isclose(float(got), float(want), rel_tol=1e-12)


def check(client, run_dir, problems):
    run_id = open(os.path.join(run_dir, "mlflow_run_id")).read().strip()
    run = client.get_run(run_id)
    if run.info.status != "FINISHED":
        problems.append("run status {}, not FINISHED".format(run.info.status))
    with open(os.path.join(run_dir, "config.toml"), "rb") as f:
        config = flat(tomllib.load(f))
    params = run.data.params
    kinds = set()
    for key, value in config.items():
        if key not in params:
            problems.append("param {} missing".format(key))
            continue
        kinds.add(type(value).__name__)
        # Strings are sent without their quotes; every other value as its TOML text ("true", "[4, 8]").
        if isinstance(value, str):
            same = params[key] == value
        else:
            try:
                same = same_value(tomllib.loads("v = " + params[key])["v"], value)
            except tomllib.TOMLDecodeError:
                same = False
        if not same:
            problems.append("param {}: server {!r}, config {!r}".format(key, params[key], value))
    for kind in ("bool", "list", "int", "float", "str"):
        if kind not in kinds:
            problems.append("the config has no {} value: the params check would not cover that kind".format(kind))
    for tag in ("trainkit.version", "trainkit.world_size", "trainkit.run_dir"):
        if tag not in run.data.tags:
            problems.append("tag {} missing".format(tag))
    val_metrics = config.get("train.metrics", ["accuracy"])
    want = {}
    for row in rows(os.path.join(run_dir, "metrics.jsonl")):
        for key, value, step in expected_metrics(row, val_metrics):
            want.setdefault(key, set()).add((step, value))
    total = 0
    for key, points in sorted(want.items()):
        history = client.get_metric_history(run_id, key)
        got = {(m.step, m.value) for m in history}
        total += len(points)
        missing = points - got
        extra = got - points
        if missing or extra:
            problems.append("metric {}: {} of {} points missing ({}...), {} unexpected ({}...)".format(
                key, len(missing), len(points), sorted(missing)[:2], len(extra), sorted(extra)[:2]))
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    for name in ("config.toml", "metrics.csv", "curves.svg", "summary.json", "model.safetensors"):
        if name not in artifacts:
            problems.append("artifact {} missing (the server has {})".format(name, sorted(artifacts)))
    if "summary.json" in artifacts:
        with tempfile.TemporaryDirectory() as d:
            local = client.download_artifacts(run_id, "summary.json", d)
            if open(local, "rb").read() != open(os.path.join(run_dir, "summary.json"), "rb").read():
                problems.append("artifact summary.json differs from the run's")
    return total, len(want)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["probe", "run"])
    ap.add_argument("--cli")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--work")
    args = ap.parse_args()
    if args.mode == "probe":
        import mlflow  # noqa: F401
        return 0
    import mlflow
    work = args.work or tempfile.mkdtemp(prefix="trainkit-mlflow-")
    os.makedirs(work, exist_ok=True)
    port = free_port()
    uri = "http://127.0.0.1:{}".format(port)
    config_path = os.path.join(work, "mlflow.toml")
    with open(config_path, "w") as f:
        f.write(CONFIG.format(data_dir=args.data_dir, uri=uri))
    run_dir = os.path.join(work, "run")
    server = start_server(work, port)
    problems = []
    try:
        # The experiment exists already (trainkit finds it by name); this also warms the server up, so that
        # the run starts logging at once.
        mlflow.MlflowClient(tracking_uri=uri).create_experiment("trainkit-ctest")
        log = open(os.path.join(work, "train.log"), "wb")
        train = subprocess.Popen([args.cli, "train", "--config", config_path, "--out", run_dir],
                                 stdout=log, stderr=subprocess.STDOUT)
        # Kill the server once the MLflow run exists and the run has written some rows, then restart it.
        metrics = os.path.join(run_dir, "metrics.jsonl")
        deadline = time.time() + 300
        while time.time() < deadline and train.poll() is None:
            if os.path.exists(os.path.join(run_dir, "mlflow_run_id")) and os.path.exists(metrics) \
                    and len(rows(metrics)) >= 10:
                break
            time.sleep(0.02)
        killed_at = len(rows(metrics)) if os.path.exists(metrics) else 0
        running_at_kill = train.poll() is None
        kill(server)
        # Training goes on while the server is down: wait for ten more rows (a count, not a time window), then
        # hold trainkit (SIGSTOP) while the server restarts, so that the run is still going when the server
        # is back however long the restart takes, and its queued points must reach the new server.
        while time.time() < deadline and train.poll() is None and len(rows(metrics)) < killed_at + 10:
            time.sleep(0.02)
        rows_down = len(rows(metrics)) if os.path.exists(metrics) else 0
        running_at_restart = train.poll() is None
        if running_at_restart:
            train.send_signal(signal.SIGSTOP)
        try:
            server = start_server(work, port)
        finally:
            if running_at_restart:
                train.send_signal(signal.SIGCONT)
        rc = train.wait(timeout=600)
        if rc != 0:
            problems.append("trainkit train exited {}; see {}".format(rc, log.name))
        client = mlflow.MlflowClient(tracking_uri=uri)
        total, keys = (0, 0)
        if not problems:
            total, keys = check(client, run_dir, problems)
        print("mlflow_check: server killed after {} metric rows (trainkit {}), restarted after {} (trainkit {}); "
              "{} rows written in all, {} points of {} metrics compared".format(
                  killed_at, "running" if running_at_kill else "exited", rows_down,
                  "running" if running_at_restart else "exited", len(rows(metrics)), total, keys))
        if not running_at_kill:
            problems.append("trainkit exited before the server was killed (nothing was tested)")
        if not running_at_restart:
            problems.append("trainkit exited while the server was down (the restart was not tested)")
        if rows_down < killed_at + 10:
            problems.append("trainkit wrote {} rows while the server was down, expected 10".format(rows_down - killed_at))
    finally:
        kill(server)
    if problems:
        print("mlflow_check: the server's run differs from the run directory ({}):".format(work), file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    print("mlflow_check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
