#!/usr/bin/env python3
"""Fails on tests that pass without testing.

    check_test_quality.py registration BUILD_DIR   (the ctest test_quality_registration)
        - every file under tests/ that holds tests registers a ctest entry: each TEST_CASE of tests/**/*.cpp is
          run by at least one Catch2 entry (listed by the entry's own filter; a hidden case counts when test
          code starts it as a child process by its tag), and every tests/*.sh and tests/*.cmake script is
          named by an entry's command;
        - a case that calls TRAINKIT_SKIP is tagged [cuda] or [may-skip], or hidden with an entry of its own:
          only those run as one entry each, where a skip is reported as Skipped (in a file's entry it would
          be reported as that entry's pass or, with SKIP_REGULAR_EXPRESSION, hide the other cases' failures);
        - Catch2's NoTests and NoAssertions warnings are in force (tests/main.cpp): a filter that matches
          nothing fails, and so does the hidden case [.quality-no-assertions], which checks nothing.
    check_test_quality.py assertions BUILD_DIR     (scripts/test.sh, after ctest)
        - every Catch2 entry that passed in the last ctest run (Testing/Temporary/LastTest.log) reports at
          least one assertion in Catch2's summary line.
Exit 1 with one line per problem, naming the file, case or entry.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TESTS = os.path.join(ROOT, "tests")
# A TEST_CASE's name and tags; the body runs to the next TEST_CASE (or the end of the file).
CASE = re.compile(r'TEST_CASE\(\s*"((?:[^"\\]|\\.)*)"\s*,\s*"([^"]*)"\s*\)')
SKIPPABLE_TAGS = ("[cuda]", "[may-skip]")


def ctest_entries(build):
    """ctest's entries of the build: name -> command (a list). ctest runs from a scratch directory that
    includes the build's tests: run in the build directory itself it would rewrite the build's
    Testing/Temporary/LastTest.log, which the ctest run this check is part of is writing."""
    with tempfile.TemporaryDirectory(prefix="trainkit-ctest-list-") as scratch:
        with open(os.path.join(scratch, "CTestTestfile.cmake"), "w") as f:
            f.write('subdirs("{}")\n'.format(build.replace("\\", "/")))
        out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=scratch, capture_output=True, text=True, check=True)
    return {t["name"]: t.get("command", []) for t in json.loads(out.stdout)["tests"]}


def catch_entries(entries):
    """The entries that run the Catch2 executable: name -> its arguments."""
    return {name: cmd[1:] for name, cmd in entries.items() if cmd and os.path.basename(cmd[0]) == "trainkit_tests"}


def test_sources():
    """tests/**/*.cpp files that declare TEST_CASEs: path -> [(name, tags, body)]."""
    out = {}
    for folder, dirs, names in os.walk(TESTS):
        dirs[:] = [d for d in dirs if d not in ("golden", "fixtures")]
        for name in sorted(names):
            if not name.endswith(".cpp"):
                continue
            path = os.path.join(folder, name)
            with open(path) as f:
                text = f.read()
            matches = list(CASE.finditer(text))
            cases = []
            for i, m in enumerate(matches):
                end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
                cases.append((m.group(1).replace('\\"', '"'), m.group(2), text[m.end():end]))
            if cases:
                out[os.path.relpath(path, ROOT)] = cases
    return out


def spec_of(args):
    """A Catch2 entry's test spec: its arguments other than options."""
    return [a for a in args if not a.startswith("-")]


def listed(binary, spec, file_tags=False):
    """The case names a Catch2 test spec selects (with -# when `file_tags`: the [#file] tags)."""
    out = subprocess.run([binary, "--list-test-names-only"] + spec + (["-#"] if file_tags else []),
                         capture_output=True, text=True)
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


def registration(build):
    problems = []
    entries = ctest_entries(build)
    catch = catch_entries(entries)
    binary = os.path.join(build, "tests", "trainkit_tests")
    run = set()
    for spec, what in (("[no-such-tag-quality-probe]", "a filter that matches nothing"),
                       ("[.quality-no-assertions]", "a test case without assertions")):
        if subprocess.run([binary, spec], capture_output=True).returncode == 0:
            problems.append("trainkit_tests passes {} ({}): tests/main.cpp must turn on Catch2's NoTests and "
                            "NoAssertions".format(what, spec))
    # The entries of whole files (one tag expression each, with -#) are listed in one call, their filters
    # joined by ',' (or); every other entry (one case, by name) on its own. An entry whose filter selects
    # nothing fails when it runs (NoTests).
    file_specs = [spec_of(args)[0] for args in catch.values() if "-#" in args and len(spec_of(args)) == 1]
    if file_specs:
        run |= listed(binary, [",".join(file_specs)], file_tags=True)
    for name, args in sorted(catch.items()):
        if "-#" in args and len(spec_of(args)) == 1:
            continue
        selected = listed(binary, spec_of(args))
        if not selected:
            problems.append("ctest entry {}: its filter selects no test case ({})".format(name, " ".join(args)))
        run |= selected
    sources = test_sources()
    all_text = {path: open(os.path.join(ROOT, path)).read() for path in sources}
    all_text["scripts/check_test_quality.py"] = open(os.path.abspath(__file__)).read()
    for path, cases in sorted(sources.items()):
        if path.startswith("tests/fuzz/"):
            continue
        for case, tags, body in cases:
            hidden = tags.startswith("[.") or "[.]" in tags
            if "TRAINKIT_SKIP(" in body and not hidden and not any(t in tags for t in SKIPPABLE_TAGS):
                problems.append("{}: \"{}\" calls TRAINKIT_SKIP but is tagged neither [cuda] nor [may-skip]: "
                                "its skip would read as a pass in its file's entry".format(path, case))
            if case in run:
                continue
            # A hidden case started by a test as a child process, by its tag.
            tag = re.match(r"\[[^\]]*\]", tags)
            started = tag and hidden and any(text.count(tag.group(0)) > (1 if p == path else 0)
                                             for p, text in all_text.items())
            if not started:
                problems.append("{}: \"{}\" {} is run by no ctest entry".format(path, case, tags))
    commands = "\n".join(" ".join(cmd) for cmd in entries.values())
    for name in sorted(os.listdir(TESTS)):
        if name.endswith((".sh", ".cmake")) and name != "CMakeLists.txt" and name not in commands:
            problems.append("tests/{}: named by no ctest entry's command".format(name))
    return problems, "{} ctest entries ({} Catch2), {} test sources, {} cases run".format(
        len(entries), len(catch), len(sources), len(run))


def assertions(build):
    """Catch2 entries that passed with zero assertions in the last ctest run."""
    problems = []
    catch = catch_entries(ctest_entries(build))
    log = os.path.join(build, "Testing", "Temporary", "LastTest.log")
    with open(log, errors="replace") as f:
        text = f.read()
    counted = 0
    # Each entry's record: "<n>/<N> Testing: <name>" ... "Test Passed." / "Test Failed." ...
    for m in re.finditer(r"^\d+/\d+ Testing: (.+?)\n(.*?)^\"\1\" end time", text, re.S | re.M):
        name, record = m.group(1), m.group(2)
        if name not in catch or "Test Passed." not in record:
            continue
        counted += 1
        got = re.search(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)", record)
        if not got:
            got = re.search(r"assertions: (\d+)", record)
        if not got or int(got.group(1)) == 0:
            problems.append("ctest entry {}: passed with {} assertions".format(name, got.group(1) if got else "no count of"))
    return problems, "{} passed Catch2 entries of {} each ran assertions".format(counted, log)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("registration", "assertions"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, build = sys.argv[1], os.path.abspath(sys.argv[2])
    problems, summary = (registration if mode == "registration" else assertions)(build)
    if problems:
        print("check_test_quality {}: {} problem(s)".format(mode, len(problems)))
        for p in problems:
            print("  " + p)
        return 1
    print("check_test_quality {}: ok ({})".format(mode, summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
