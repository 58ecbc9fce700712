#!/usr/bin/env bash
# Two `trainkit tune` processes on one study directory at once (as on two machines sharing it): a study of 4
# trials in total must hold exactly 4 distinct trials (numbers, run directories), each finished once, created
# by both workers, every run directory complete, and no lock left behind. That both workers create trials
# does not depend on timing: the first trial's `trainkit train` is held (SIGSTOP) until the study holds a
# second trial, which only the other worker can create (each worker runs one trial at a time).
# Usage: run_tune_workers.sh CLI CONFIG SPACE OUT [--set ... (a tiny config)]
set -euo pipefail
cli=$1 config=$2 space=$3 out=$4
shift 4
rm -rf "$out"
mkdir -p "$out"
fail() { echo "app_tune_two_workers: $*"; for w in 1 2; do echo "--- worker $w:"; cat "$out/worker$w.log"; done; exit 1; }
"$cli" tune --config "$config" --space "$space" --out "$out" --trials 4 --jobs 1 "$@" > "$out/worker1.log" 2>&1 &
first=$!
"$cli" tune --config "$config" --space "$space" --out "$out" --trials 4 --jobs 1 "$@" > "$out/worker2.log" 2>&1 &
second=$!
journal=$out/study.journal
created() { grep -c '"op_code":4,' "$journal" 2>/dev/null || true; }
# The first trial's training process (a child of either worker), held until the other worker creates one.
held=""
for _ in $(seq 1 3000); do
  held=$(pgrep -P "$first" || pgrep -P "$second" || true)
  [ -n "$held" ] && break
  kill -0 "$first" 2>/dev/null || kill -0 "$second" 2>/dev/null || break
  sleep 0.05
done
[ -n "$held" ] || fail "no trial started within 150 s"
held=$(echo "$held" | head -n 1)
kill -STOP "$held"
for _ in $(seq 1 3000); do
  [ "$(created)" -ge 2 ] && break
  sleep 0.05
done
kill -CONT "$held"
[ "$(created)" -ge 2 ] || fail "the other worker created no trial while the first trial was held (150 s)"
wait "$first" || fail "worker 1 failed"
wait "$second" || fail "worker 2 failed"
created=$(created)
[ "$created" -eq 4 ] || fail "$created trials created, expected 4"
study=$(basename "$out")  # the study's name, and its directory under trials/
dirs=$(grep -o "\"trainkit_dir\":\"trials/$study/trial-[0-9]*\"" "$journal" | sort -u | wc -l)
[ "$dirs" -eq 4 ] || fail "$dirs distinct run directories, expected 4"
finished=$(grep '"op_code":6,' "$journal" | grep -o '"trial_id":[0-9]*' | sort | uniq -c | awk '$1 == 1' | wc -l)
ends=$(grep -c '"op_code":6,' "$journal" || true)
[ "$finished" -eq 4 ] && [ "$ends" -eq 4 ] || fail "$ends state changes for $finished trials finished once, expected 4 and 4"
creators=$(grep '"op_code":4,' "$journal" | grep -o '"worker_id":"[^"]*"' | sort -u | wc -l)
[ "$creators" -eq 2 ] || fail "trials created by $creators workers, expected 2"
for n in 0 1 2 3; do
  [ -f "$out/trials/$study/trial-000$n/summary.json" ] || fail "no $out/trials/$study/trial-000$n/summary.json"
done
[ ! -e "$journal.lock" ] && [ ! -L "$journal.lock" ] || fail "the lock $journal.lock was left behind"
echo "app_tune_two_workers: 4 distinct trials by 2 workers, each finished once"
