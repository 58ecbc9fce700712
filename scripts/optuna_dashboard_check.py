#!/usr/bin/env python3
"""optuna-dashboard serves a journal trainkit wrote (tests/app/test_study_journal.cpp, ctest
optuna_dashboard_serves_journal):

    optuna_dashboard_check.py probe
        exits 3 when optuna-dashboard is not installed (the test is then skipped), else 0.
    optuna_dashboard_check.py serve JOURNAL STUDY EXPECTED.json
        starts `optuna-dashboard JOURNAL` on 127.0.0.1 (a free port), reads the study list and the study's
        trials from its HTTP API (/api/studies, /api/studies/<id>) and compares each trial's number, state,
        values and params with EXPECTED.json (the format of scripts/optuna_journal_check.py); exits 1 on a
        difference, 0 when they agree.
"""
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request

STATES = {"COMPLETE": "Complete", "PRUNED": "Pruned", "FAIL": "Fail", "RUNNING": "Running"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path):
    with urllib.request.urlopen("http://127.0.0.1:{}{}".format(port, path), timeout=5) as r:
        return json.loads(r.read())


def serve(journal, name, expected_path):
    with open(expected_path) as f:
        expected = json.load(f)
    port = free_port()
    code = "import sys; from optuna_dashboard._cli import main; sys.argv[0] = 'optuna-dashboard'; main()"
    server = subprocess.Popen([sys.executable, "-c", code, journal, "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            try:
                studies = get(port, "/api/studies")["study_summaries"]
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    print(server.stdout.read().decode(errors="replace"))
                    print("optuna_dashboard_check: the dashboard did not answer on port {}".format(port))
                    return 1
                time.sleep(0.2)
        ids = [s["study_id"] for s in studies if s["study_name"] == name]
        if not ids:
            print("optuna_dashboard_check: no study {} in {}".format(name, studies))
            return 1
        trials = get(port, "/api/studies/{}?after=0".format(ids[0]))["trials"]
        problems = []
        if len(trials) != len(expected["trials"]):
            problems.append("{} trials, expected {}".format(len(trials), len(expected["trials"])))
        for t, want in zip(trials, expected["trials"]):
            where = "trial {}".format(t["number"])
            if t["number"] != want["number"] or t["state"] != STATES[want["state"]]:
                problems.append("{}: state {}, expected {}".format(where, t["state"], want["state"]))
            if (t.get("values") or None) != want["values"]:
                problems.append("{}: values {}, expected {}".format(where, t.get("values"), want["values"]))
            params = {p["name"]: p["param_external_value"] for p in t["params"]}
            for k, v in want["params"].items():
                got = params.get(k)
                ok = got is not None and (math.isclose(float(got), v, rel_tol=1e-15) if isinstance(v, float)
                                          else str(got) == str(v))
                if not ok:
                    problems.append("{}: param {} = {}, expected {}".format(where, k, got, v))
        if problems:
            print("optuna_dashboard_check: optuna-dashboard serves {} differently:".format(journal))
            for p in problems:
                print("  " + p)
            return 1
        print("optuna-dashboard served {} trials".format(len(trials)))
        return 0
    finally:
        server.terminate()
        server.wait(timeout=10)


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "probe":
        try:
            import optuna_dashboard  # noqa: F401
        except ImportError:
            return 3
        return 0
    if len(sys.argv) == 5 and sys.argv[1] == "serve":
        return serve(sys.argv[2], sys.argv[3], sys.argv[4])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
