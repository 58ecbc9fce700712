#!/usr/bin/env bash
# Full-disk check of `trainkit train` on a real filesystem that runs out of space: a 2 MiB tmpfs holds the
# run directory. (1) A run of one epoch completes there. (2) The disk is filled to 100 KiB free, less than
# one checkpoint: resuming for a second epoch must fail at the next checkpoint write with an error naming the
# file and ENOSPC, exit 1, leave no temporary file and leave the newest checkpoint loadable and unchanged.
# (3) The disk is filled to the last byte: the same, failing at its first write. (4) Space is freed: resuming
# completes, and the final checkpoint is bitwise the one of an uninterrupted two-epoch run; metrics.jsonl
# holds only complete JSON rows. Needs root (mount); prints "trainkit-skip:" and exits 0 where it cannot mount.
#
# Usage: scripts/full_disk.sh --cli build/apps/trainkit [--data-dir DIR]
set -euo pipefail

cli=""
data_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cli) cli="$2"; shift 2 ;;
    --data-dir) data_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "full_disk: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
# shellcheck source=fault_run_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/fault_run_common.sh"
require_cli full_disk "$cli"
work=$(mktemp -d)
disk="$work/disk"
mkdir -p "$disk"
cleanup() {
  umount "$disk" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
if [ "$(id -u)" -ne 0 ] || ! mount -t tmpfs -o size=2m tmpfs "$disk" 2>/dev/null; then
  echo "trainkit-skip: cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)"
  exit 0
fi

config="$work/full.toml"
write_config "$config" "$data_dir" <<'TOML'
val_size = 100
limit_train = 400
limit_test = 100
[model]
name = "mlp"
hidden = 16
[optimizer]
name = "adamw"
lr = 0.003
[train]
epochs = 1
batch_size = 50
seed = 3
threads = 1
[checkpoint]
every_steps = 1
keep_last = 2
[log]
every_steps = 1
progress = "lines"
TOML

fail() {
  echo "full_disk: $*" >&2
  exit 1
}
newest() { ls "$1"/checkpoints/ckpt-*.tkpt | sort | tail -n 1; }
digest() { "$cli" checkpoint "$1" | sed 's/.*: ok, //'; }
free_kib() { df -k --output=avail "$disk" | tail -n 1 | tr -d ' '; }

"$cli" train --config "$config" --set train.epochs=2 --out "$work/reference" >"$work/reference.log" 2>&1 ||
  fail "the reference run failed: $(tail -n 5 "$work/reference.log")"
reference=$(digest "$(newest "$work/reference")")

run="$disk/run"
"$cli" train --config "$config" --out "$run" >"$work/first.log" 2>&1 || fail "the first epoch failed: $(tail -n 5 "$work/first.log")"
saved=$(newest "$run")
saved_digest=$(digest "$saved")

for leave in 100 0; do
  rm -f "$disk/filler"
  avail=$(free_kib)
  if [ "$avail" -gt "$leave" ]; then
    dd if=/dev/zero of="$disk/filler" bs=1k count=$((avail - leave)) 2>/dev/null || true
  fi
  log="$work/full-$leave.log"
  rc=0
  "$cli" train --config "$config" --set train.epochs=2 --out "$run" --resume auto >"$log" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] || fail "with $(free_kib) KiB free: exit $rc, expected 1: $(tail -n 5 "$log")"
  line=$(grep -m 1 "No space left on device" "$log") || fail "with $(free_kib) KiB free: no ENOSPC error: $(tail -n 5 "$log")"
  [[ $line == *"$run/"* ]] || fail "the error does not name a file of the run directory: $line"
  if ls -A "$run/checkpoints" | grep -q '\.tmp\.'; then fail "temporary files left in $run/checkpoints"; fi
  [ "$(newest "$run")" = "$saved" ] || fail "the newest checkpoint changed to $(newest "$run")"
  [ "$(digest "$saved")" = "$saved_digest" ] || fail "the newest checkpoint $saved changed or does not load"
  echo "full_disk: $leave KiB free: exit 1, ${line#*error }; $saved still loads"
done

rm -f "$disk/filler"
"$cli" train --config "$config" --set train.epochs=2 --out "$run" --resume auto >"$work/resumed.log" 2>&1 ||
  fail "the resumed run failed after space was freed: $(tail -n 5 "$work/resumed.log")"
got=$(digest "$(newest "$run")")
[ "$got" = "$reference" ] || fail "resumed after a full disk: $got, uninterrupted: $reference"
while IFS= read -r row; do
  [[ $row == "{"*"}" ]] || fail "metrics.jsonl holds a partial row: $row"
done <"$run/metrics.jsonl"
echo "full_disk: resumed after space was freed; final checkpoint bitwise equal to the uninterrupted run ($got)"
