#!/usr/bin/env bash
# Kill-anywhere check of `trainkit train`: SIGKILLs a small training run at random moments (start-up,
# steps, checkpoint writes, the end), resumes it each time with `--resume auto`, and checks that the
# run it finally completes ends bitwise equal to an uninterrupted one and that no damaged checkpoint was
# ever met. Rounds (a fresh run each) repeat until --kills kills were made. With --nproc N > 1 the run is
# `trainkit launch --nproc N` with [zero] stage = 2 (every rank saves its shard, rank 0 commits the step)
# and each kill hits one rank, chosen at random (the launcher then stops the others).
#
# Usage: scripts/kill_anywhere.sh --cli build/apps/trainkit [--kills 50] [--seed 1] [--work DIR]
#                                 [--data-dir DIR] [--nproc N]
# Prints one line per round and a summary; exits 1 (naming the round and the reason) on any departure.
set -euo pipefail

cli=""
kills_wanted=50
seed=1
work=""
data_dir=""
nproc=1
while [ $# -gt 0 ]; do
  case "$1" in
    --cli) cli="$2"; shift 2 ;;
    --kills) kills_wanted="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --data-dir) data_dir="$2"; shift 2 ;;
    --nproc) nproc="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "kill_anywhere: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
# shellcheck source=fault_run_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/fault_run_common.sh"
require_cli kill_anywhere "$cli"
if [ -z "$work" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
RANDOM=$seed

# A small run that checkpoints after every step, so that many kills land in a checkpoint write.
config="$work/kill.toml"
write_config "$config" "$data_dir" <<'TOML'
val_size = 100
limit_train = 600
limit_test = 200
[model]
channels = [4, 8]
hidden = 16
[optimizer]
name = "adamw"
lr = 0.003
[train]
epochs = 3
batch_size = 25
seed = 3
threads = 1
[checkpoint]
every_steps = 1
keep_last = 2
[log]
every_steps = 5
progress = "lines"
TOML
train=("$cli" train)
if [ "$nproc" -gt 1 ]; then
  printf '[zero]\nstage = 2\n[distributed]\nbackend = "gloo"\ntimeout = 20\n' >>"$config"
  train=("$cli" launch --nproc "$nproc" --master-port 0 -- "$cli" train)
fi

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
final_digest() {  # the digest of a run directory's newest checkpoint (sharded: rank 0's shard of the newest commit)
  local newest
  if [ "$nproc" -gt 1 ]; then
    newest=$(ls "$1"/checkpoints/ckpt-*.commit | sort | tail -n 1)
    newest="${newest%.commit}.rank0-of-$nproc.tkpt"
  else
    newest=$(ls "$1"/checkpoints/ckpt-*.tkpt | sort | tail -n 1)
  fi
  "$cli" checkpoint "$newest" | sed 's/.*: ok, //'
}
rank_pid() {  # the pid of rank $2 among the children of launcher $1 (empty until it has started)
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do
    if tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx "RANK=$2"; then echo "$child"; return; fi
  done
}

start=$(now_ms)
"${train[@]}" --config "$config" --out "$work/reference" >"$work/reference.log" 2>&1 || {
  echo "kill_anywhere: the uninterrupted reference run failed:" >&2
  cat "$work/reference.log" >&2
  exit 1
}
reference_ms=$(( $(now_ms) - start ))
reference=$(final_digest "$work/reference")
echo "reference run: ${reference_ms} ms, final checkpoint: $reference"

# Each attempt is killed after a delay drawn uniformly from [0, span_ms] (short delays kill during
# start-up and resume, long ones late in the run), every other one only once the next checkpoint write
# has begun after that delay. span_ms starts at the reference run's time and shrinks to the fastest fresh
# run seen since: a reference slowed down by a busy machine (other tests beside it) would otherwise draw
# most delays past the end of the run, and rounds would end without kills until the time limit.
span_ms=$reference_ms
kills=0
mid_save=0
round=0
attempts_total=0
while [ "$kills" -lt "$kills_wanted" ]; do
  round=$((round + 1))
  run="$work/round-$round"
  round_kills=0
  for attempt in $(seq 1 1000); do
    attempts_total=$((attempts_total + 1))
    attempt_start=$(now_ms)
    "${train[@]}" --config "$config" --out "$run" --resume auto >"$run.attempt.log" 2>&1 &
    pid=$!
    rank=$(( RANDOM % nproc ))
    temporaries="$run/checkpoints/.ckpt-*.tmp.*"
    if [ "$nproc" -gt 1 ]; then temporaries="$run/checkpoints/.ckpt-*.rank$rank-of-$nproc.tkpt.tmp.*"; fi
    delay_ms=$(( (RANDOM * 32768 + RANDOM) % (span_ms + 1) ))
    sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
    victim=$pid
    if [ "$nproc" -gt 1 ]; then victim=$(rank_pid "$pid" "$rank"); victim=${victim:-$pid}; fi
    if (( RANDOM % 2 )); then
      # Every other attempt waits from there for the next checkpoint's temporary file (of the rank to kill)
      # to appear and kills at once: inside the write, the fsyncs or just after the rename.
      while kill -0 "$pid" 2>/dev/null && ! compgen -G "$temporaries" >/dev/null; do :; done
    fi
    kill -9 "$victim" 2>/dev/null || true
    rc=0
    { wait "$pid"; } 2>/dev/null || rc=$?
    cat "$run.attempt.log" >>"$run.log"
    if [ "$rc" -ne 0 ] && [ "$victim" != "$pid" ] && grep -q "was killed by signal 9" "$run.attempt.log"; then
      rc=137  # the launcher reports the rank it lost and stops the others
    fi
    if [ "$rc" -eq 0 ]; then
      elapsed_ms=$(( $(now_ms) - attempt_start ))
      if [ "$attempt" -eq 1 ] && [ "$elapsed_ms" -lt "$span_ms" ]; then
        span_ms=$elapsed_ms  # a whole run from scratch, faster than the span: draw from its length
        echo "round $round: an uninterrupted run took ${elapsed_ms} ms; delays now drawn from [0, ${span_ms}] ms"
      fi
      break  # finished before the signal
    fi
    if [ "$rc" -ne 137 ]; then
      echo "kill_anywhere: round $round attempt $attempt: trainkit train exited $rc, not killed:" >&2
      tail -n 20 "$run.attempt.log" >&2
      exit 1
    fi
    kills=$((kills + 1))
    round_kills=$((round_kills + 1))
    if ls -A "$run/checkpoints" 2>/dev/null | grep -q '\.tmp\.'; then
      mid_save=$((mid_save + 1))  # a temporary file: killed while writing a checkpoint
    fi
  done
  if grep -q "skipping damaged checkpoint" "$run.log"; then
    echo "kill_anywhere: round $round met a damaged checkpoint:" >&2
    grep "skipping damaged checkpoint" "$run.log" >&2
    exit 1
  fi
  if ls -A "$run/checkpoints" | grep -q '\.tmp\.'; then
    echo "kill_anywhere: round $round: temporary files left in $run/checkpoints after the run completed" >&2
    exit 1
  fi
  got=$(final_digest "$run")
  if [ "$got" != "$reference" ]; then
    echo "kill_anywhere: round $round ($round_kills kills): final checkpoint differs from the reference" >&2
    echo "  reference: $reference" >&2
    echo "  this run:  $got" >&2
    exit 1
  fi
  resumes=$(grep -c "resumed from" "$run.log" || true)
  echo "round $round: $round_kills kills, $resumes resumes from a checkpoint, final checkpoint bitwise equal"
done
echo "kill_anywhere: $kills kills in $round rounds ($mid_save during a checkpoint write, $attempts_total runs" \
     "started); every round ended bitwise equal to the uninterrupted run; no damaged checkpoint was met"
