#!/usr/bin/env bash
# Builds trainkit's library, apps, benchmarks and tests with AddressSanitizer + UndefinedBehaviorSanitizer
# (trainkit's code instrumented; LibTorch as shipped) and runs the whole ctest under them.
# Usage: scripts/sanitize.sh [ctest args...]   Build directory: $TRAINKIT_SANITIZE_BUILD_DIR (default build-asan/).
# Suppressions (scripts/sanitize/*.supp) cover findings inside LibTorch only, each with its reason.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${TRAINKIT_SANITIZE_BUILD_DIR:-$root/build-asan}"
"$root/scripts/setup.sh"
TRAINKIT_BUILD_TYPE=RelWithDebInfo "$root/scripts/build.sh" "$build" -DTRAINKIT_SANITIZE=address,undefined
# protect_shadow_gap=0: LibTorch's CUDA libraries map memory where ASan's shadow gap would be.
export ASAN_OPTIONS="protect_shadow_gap=0:detect_leaks=1:abort_on_error=0:halt_on_error=1:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$root/scripts/sanitize/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
cd "$build"
ctest --output-on-failure -j "${TRAINKIT_JOBS:-2}" "$@"
