#!/usr/bin/env bash
# Fuzzes trainkit's parsers of outside input with libFuzzer, each target for a bounded time.
# Usage: scripts/fuzz.sh [--seconds N] [TARGET...]
#   TARGET: idx idx_gz cifar fortunes config factories checkpoint safetensors (default: all); N: seconds per target
#   (default 60). Builds the fuzzers in scripts/sanitize.sh's build directory (build-asan/: clang, trainkit's
#   code with ASan + UBSan and libFuzzer's coverage; LibTorch as shipped). Seeds: tests/fuzz/corpus/<target>/
#   (read only); what the fuzzer adds goes to build-asan/corpus/<target>/, crashes, leaks, timeouts and
#   out-of-memory inputs to build-asan/findings/<target>/. Prints a table of executions, corpus size and
#   findings per target, and exits 1 when any target found something. A finding is fixed with its input
#   committed under tests/fuzz/regressions/<target>/ (replayed by ctest's fuzz_replay in every build).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${TRAINKIT_SANITIZE_BUILD_DIR:-$root/build-asan}"
seconds=60
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=(idx idx_gz cifar fortunes config factories checkpoint safetensors)
if ((${#targets[@]} == 0)); then targets=("${all[@]}"); fi
for t in "${targets[@]}"; do
  if [[ " ${all[*]} " != *" $t "* ]]; then
    echo "fuzz: unknown target '$t' (targets: ${all[*]})" >&2
    exit 2
  fi
done

fuzzers=()
for t in "${targets[@]}"; do fuzzers+=("fuzz_$t"); done
TRAINKIT_SANITIZE_BUILD_DIR="$build" "$root/scripts/sanitize.sh" --build-only "${fuzzers[@]}"

# shellcheck source=sanitize/env.sh
source "$root/scripts/sanitize/env.sh"
export OMP_NUM_THREADS=1

declare -A max_len=([cifar]=8192 [checkpoint]=65536)
summary="$build/fuzz-summary.md"
echo "| target | seconds | executions | exec/s | corpus (seeds + found) | coverage (edges) | findings |" > "$summary"
echo "|---|---|---|---|---|---|---|" >> "$summary"
status=0
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  findings="$build/findings/$t"
  mkdir -p "$corpus" "$findings"
  seeds="$root/tests/fuzz/corpus/$t"
  log="$build/findings/$t.log"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=1024
        -print_final_stats=1 -artifact_prefix="$findings/")
  if [ -n "${max_len[$t]:-}" ]; then args+=(-max_len="${max_len[$t]}"); fi
  echo "fuzz: $t for ${seconds}s"
  before=$(find "$findings" -type f | wc -l)
  rc=0
  "$build/tests/fuzz/fuzz_$t" "${args[@]}" "$corpus" "$seeds" > "$log" 2>&1 || rc=$?
  after=$(find "$findings" -type f | wc -l)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'exec/s: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  n_seeds=$(find "$seeds" -type f | wc -l)
  n_found=$(find "$corpus" -type f | wc -l)
  found=$((after - before))
  echo "| $t | $seconds | ${execs:-?} | ${rate:-?} | $n_seeds + $n_found | ${cov:-?} | $found |" >> "$summary"
  if ((rc != 0 || found > 0)); then
    status=1
    echo "fuzz: $t FOUND something (exit $rc); log: $log, inputs: $findings" >&2
    grep -m5 -E 'ERROR|SUMMARY|invariant|escaped|deadly|out-of-memory|timeout' "$log" >&2 || true
  fi
done
cat "$summary"
exit "$status"
