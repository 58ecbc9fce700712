#!/usr/bin/env bash
# Builds trainkit's library, apps, benchmarks and tests with clang's AddressSanitizer +
# UndefinedBehaviorSanitizer (trainkit's code instrumented; LibTorch as shipped) and runs the whole ctest
# under them. The same build directory holds the libFuzzer executables of scripts/fuzz.sh (trainkit's code
# also carries libFuzzer's coverage hooks, inert outside a fuzzer).
# Usage: scripts/sanitize.sh [ctest args...]          build everything, run ctest
#        scripts/sanitize.sh --build-only TARGET...   build only these targets (scripts/fuzz.sh)
# Build directory: $TRAINKIT_SANITIZE_BUILD_DIR (default build-asan/).
# Suppressions (scripts/sanitize/*.supp) cover findings inside LibTorch only, each with its reason.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${TRAINKIT_SANITIZE_BUILD_DIR:-$root/build-asan}"
build_only=()
if [ "${1:-}" = "--build-only" ]; then
  shift
  build_only=("$@")
  set --
fi
"$root/scripts/setup.sh" --fuzz
TRAINKIT_TARGETS="${build_only[*]}" TRAINKIT_BUILD_TYPE=RelWithDebInfo "$root/scripts/build.sh" "$build" \
  -DCMAKE_CXX_COMPILER=clang++ -DTRAINKIT_SANITIZE=address,undefined,fuzzer-no-link -DTRAINKIT_FUZZ=ON
if ((${#build_only[@]})); then
  exit 0
fi
# shellcheck source=sanitize/env.sh
source "$root/scripts/sanitize/env.sh"
cd "$build"
ctest --output-on-failure -j "${TRAINKIT_JOBS:-2}" "$@"
