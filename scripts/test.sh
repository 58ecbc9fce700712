#!/usr/bin/env bash
# Sets up what is missing (scripts/setup.sh), builds trainkit with its tests, runs ctest, and checks that every
# Catch2 entry that passed ran assertions (scripts/check_test_quality.py).
# Usage: scripts/test.sh [ctest args...]     Build directory: $TRAINKIT_BUILD_DIR (default build/).
# The compiler is clang++ (TRAINKIT_CXX=g++ for GCC): with a precompiled LibTorch header it compiles the
# tree in about half GCC's time (docs/architecture.md#build). tests/consumer builds a program against the
# installed library with CMake's default compiler (GCC on Debian), so GCC still compiles every public header.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${TRAINKIT_BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh" --build-only
# The Python oracles (only the tests need them) install and byte-compile while the build runs: pip works one
# file at a time, and the build takes the other core.
mkdir -p "$build"
"$root/scripts/setup.sh" --oracles-only > "$build/setup-oracles.log" 2>&1 &
oracles=$!
export TRAINKIT_CXX="${TRAINKIT_CXX:-clang++}"
if ! "$root/scripts/build.sh" "$build"; then
  wait "$oracles" || true
  exit 1
fi
if ! wait "$oracles"; then
  cat "$build/setup-oracles.log" >&2
  echo "scripts/test.sh: installing the Python oracles failed (log above: $build/setup-oracles.log)" >&2
  exit 1
fi
cat "$build/setup-oracles.log"
cd "$build"
# One test more than the cores: the tests wait on child processes, sockets and servers (2 cores ran 85% busy
# at -j 2). TRAINKIT_TEST_JOBS overrides. With more threads than cores, OpenMP threads that spin while they
# wait take the cores from the other tests: passive waiting (three test_optim runs at once on 2 cores:
# 66 s instead of 78 s). It changes no result.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
ctest --output-on-failure -j "${TRAINKIT_TEST_JOBS:-$(( $(nproc) + 1 ))}" "$@"
# Every Catch2 entry that passed ran at least one assertion (its summary line, in ctest's log of this run).
"${TRAINKIT_VENV:-$root/.venv}/bin/python" "$root/scripts/check_test_quality.py" assertions "$build"
