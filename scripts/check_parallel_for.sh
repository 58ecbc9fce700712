#!/usr/bin/env bash
# Fails if any of trainkit's sources calls at::parallel_for / at::parallel_reduce directly, except
# libtrainkit/src/detail/parallel_range.cpp: LibTorch's versions are inline templates that run on one thread
# in code compiled without OpenMP (trainkit compiles only that one source with OpenMP), so a direct call
# silently loses the parallelism — the kernels ran serially for that reason until issue 18's third round.
# Call trainkit::detail::parallel_range (detail/parallel_range.h) instead. Comment lines are ignored.
# Usage: scripts/check_parallel_for.sh [PROJECT_ROOT]
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root"
# Each candidate line with its comment (from "//") cut off must still call one of them.
hits=$(grep -rnE --include='*.cpp' --include='*.h' --include='*.hpp' 'at::parallel_(for|reduce)' \
         libtrainkit apps bench tests \
       | grep -v '^libtrainkit/src/detail/parallel_range.cpp:' \
       | while IFS= read -r hit; do
           code=${hit#*:*:}
           code=${code%%//*}
           if [[ $code =~ at::parallel_(for|reduce)[[:space:]]*[\(\<] ]]; then echo "$hit"; fi
         done || true)
if [ -n "$hits" ]; then
  echo "check_parallel_for: direct calls of at::parallel_for/parallel_reduce (serial without OpenMP; use" >&2
  echo "trainkit::detail::parallel_range from detail/parallel_range.h):" >&2
  echo "$hits" >&2
  exit 1
fi
echo "check_parallel_for: no direct at::parallel_for/parallel_reduce outside detail/parallel_range.cpp"
