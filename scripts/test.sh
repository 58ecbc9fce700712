#!/usr/bin/env bash
# Sets up what is missing (scripts/setup.sh), builds trainkit with its tests, and runs ctest.
# Usage: scripts/test.sh [ctest args...]     Build directory: $TRAINKIT_BUILD_DIR (default build/).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${TRAINKIT_BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$build"
cd "$build"
ctest --output-on-failure -j "${TRAINKIT_JOBS:-2}" "$@"
