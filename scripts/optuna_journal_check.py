#!/usr/bin/env python3
"""Python Optuna's side of trainkit's journal tests (tests/tune/test_optuna_journal.cpp,
tests/app/test_study_journal.cpp):

    optuna_journal_check.py read JOURNAL STUDY EXPECTED.json
        optuna.load_study(storage=JournalStorage(JournalFileBackend(JOURNAL))) must see the trials that trainkit
        wrote, as EXPECTED.json lists them ({"trials": [{"number", "state" (RUNNING, COMPLETE, PRUNED, FAIL),
        "values" (list or null), "params" {name: value}, "intermediate" {step: value, null for NaN},
        "user_attrs" {key: value}}], "user_attrs": {...}}); then one more trial by Python must go in.
        Prints what differs and exits 1, or prints "optuna read N trials" and exits 0.
    optuna_journal_check.py worker JOURNAL STUDY N
        A Python Optuna worker: N trials of x in [0, 1] (value x) on study STUDY, created when missing.
"""
import json
import math
import sys

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend


def same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return (a is None or math.isnan(a)) and (b is None or math.isnan(b))
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def read(path, name, expected_path):
    with open(expected_path) as f:
        expected = json.load(f)
    storage = JournalStorage(JournalFileBackend(path))
    study = optuna.load_study(study_name=name, storage=storage)
    problems = []
    if len(study.trials) != len(expected["trials"]):
        problems.append("{} trials, expected {}".format(len(study.trials), len(expected["trials"])))
    # Trials pair up by position only when both lists are as long (a difference was named above).
    for t, want in zip(study.trials, expected["trials"]):
        where = "trial {}".format(t.number)
        if t.number != want["number"]:
            problems.append("{}: number, expected {}".format(where, want["number"]))
        if t.state.name != want["state"]:
            problems.append("{}: state {}, expected {}".format(where, t.state.name, want["state"]))
        got_values = t.values
        if (got_values is None) != (want["values"] is None) or (
                got_values is not None and (len(got_values) != len(want["values"]) or
                                            not all(same(a, b) for a, b in zip(got_values, want["values"])))):
            problems.append("{}: values {}, expected {}".format(where, got_values, want["values"]))
        if set(t.params) != set(want["params"]) or not all(same(t.params[k], want["params"][k]) for k in t.params):
            problems.append("{}: params {}, expected {}".format(where, t.params, want["params"]))
        got_steps = {str(k): v for k, v in t.intermediate_values.items()}
        if set(got_steps) != set(want["intermediate"]) or not all(
                same(got_steps[k], want["intermediate"][k]) for k in got_steps):
            problems.append("{}: intermediate {}, expected {}".format(where, got_steps, want["intermediate"]))
        for k, v in want["user_attrs"].items():
            if t.user_attrs.get(k) != v:
                problems.append("{}: user attr {} = {!r}, expected {!r}".format(where, k, t.user_attrs.get(k), v))
    for k, v in expected.get("user_attrs", {}).items():
        if study.user_attrs.get(k) != v:
            problems.append("study user attr {} = {!r}, expected {!r}".format(k, study.user_attrs.get(k), v))
    if problems:
        print("optuna_journal_check: Optuna reads {} differently from what trainkit wrote:".format(path))
        for p in problems:
            print("  " + p)
        return 1
    # Python extends the study trainkit wrote, with the same distributions.
    first = study.trials[0]
    trial = study.ask()
    for k, d in first.distributions.items():
        trial._suggest(k, d)
    study.tell(trial, 1.0)
    print("optuna read {} trials".format(len(expected["trials"])))
    return 0


def worker(path, name, n):
    storage = JournalStorage(JournalFileBackend(path))
    study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                                sampler=optuna.samplers.RandomSampler())
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=n)
    return 0


def main():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if len(sys.argv) == 5 and sys.argv[1] == "read":
        return read(sys.argv[2], sys.argv[3], sys.argv[4])
    if len(sys.argv) == 5 and sys.argv[1] == "worker":
        return worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
