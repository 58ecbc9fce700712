#!/usr/bin/env bash
# Fails if any object file of a trainkit build calls at::parallel_for / at::parallel_reduce, except
# libtrainkit/src/detail/parallel_range.cpp's: LibTorch's versions are inline templates that run on one
# thread in code compiled without OpenMP (trainkit compiles only that one source with OpenMP), so a direct
# call silently loses the parallelism. Call trainkit::detail::parallel_range (detail/parallel_range.h).
#
# The check reads symbols, not text, so a call after `using namespace at;` or through a macro is caught:
# every instantiation of either template outside an OpenMP region constructs a c10::ParallelGuard, a
# function that LibTorch exports, so the object file that calls one holds an undefined reference to
# c10::ParallelGuard::ParallelGuard(bool).
#
# Usage: scripts/check_parallel_for.sh BUILD_DIR             checks every object under BUILD_DIR
#        scripts/check_parallel_for.sh --selftest PROBE_DIR  fails unless every object under PROBE_DIR is
#                                                            flagged (tests/parallel_for_probe's objects)
set -euo pipefail
mode=check
if [ "${1:-}" = "--selftest" ]; then
  mode=selftest
  shift
fi
dir="${1:?usage: check_parallel_for.sh [--selftest] DIR}"
if [ ! -d "$dir" ]; then
  echo "check_parallel_for: no directory $dir" >&2
  exit 2
fi
guard='c10::ParallelGuard::ParallelGuard(bool)'
calls() { nm -C --undefined-only "$1" 2>/dev/null | grep -qF "$guard"; }

mapfile -t objects < <(find "$dir" -name '*.o' -type f | sort)
if [ "${#objects[@]}" -eq 0 ]; then
  echo "check_parallel_for: no object files under $dir (build first)" >&2
  exit 2
fi

if [ "$mode" = selftest ]; then
  for o in "${objects[@]}"; do
    if ! calls "$o"; then
      echo "check_parallel_for: self-test: $o calls at::parallel_for/reduce but was not flagged" >&2
      exit 1
    fi
  done
  echo "check_parallel_for: self-test: all ${#objects[@]} probe objects flagged"
  exit 0
fi

hits=()
for o in "${objects[@]}"; do
  case "$o" in
    */parallel_range.cpp.o | */parallel_for_probes.dir/*) continue ;;
  esac
  if calls "$o"; then hits+=("$o"); fi
done
if [ "${#hits[@]}" -gt 0 ]; then
  echo "check_parallel_for: these objects call at::parallel_for/parallel_reduce (serial without OpenMP; use" >&2
  echo "trainkit::detail::parallel_range from detail/parallel_range.h); a Unity/unity_*.cxx.o object holds" >&2
  echo "the sources its .cxx file includes:" >&2
  printf '  %s\n' "${hits[@]}" >&2
  exit 1
fi
echo "check_parallel_for: none of ${#objects[@]} objects calls at::parallel_for/parallel_reduce outside detail/parallel_range.cpp"
