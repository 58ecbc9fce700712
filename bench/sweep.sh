#!/usr/bin/env bash
# Trains variants of one config over several seeds and prints a Markdown table of their results: an
# ablation or a recipe sweep in one command (docs/case_studies.md#time-to-accuracy).
# Usage: bench/sweep.sh [options] CONFIG VARIANTS
#   CONFIG             the base config (e.g. configs/fast.toml)
#   VARIANTS           a file with one variant per line: NAME [KEY=VALUE ...] (the --set overrides of that
#                      variant; none = the base config); blank lines and lines starting with # are skipped
#   --trainkit BIN     the trainkit program (default: build/apps/trainkit)
#   --out DIR          where the runs go: DIR/NAME/seed-S (default: runs/sweep); a run whose summary.json
#                      exists is not run again, so an interrupted sweep continues
#   --seeds "S ..."    seeds of every variant (default: "0 1 2")
#   --jobs K           runs at once (default 1: timings are only comparable one run at a time)
#   --set KEY=VALUE    an override of every run (repeatable), e.g. --set train.device=cuda
# Prints per variant: test accuracy per seed, their min / median / max, the median wall time and the
# median seconds at which validation first reached each log.time_to_accuracy threshold.
# Needs python3 for the table (the runs themselves do not).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
trainkit="$root/build/apps/trainkit"
out=runs/sweep
seeds="0 1 2"
jobs=1
common=()
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
args=()
while (($#)); do
  case "$1" in
    --trainkit) trainkit=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --set) common+=(--set "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "sweep.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if ((${#args[@]} != 2)); then echo "sweep.sh: expected CONFIG and VARIANTS (see --help)" >&2; exit 2; fi
config=${args[0]}
variants=${args[1]}
for f in "$config" "$variants"; do
  [ -f "$f" ] || { echo "sweep.sh: no file '$f'" >&2; exit 2; }
done
[ -x "$trainkit" ] || { echo "sweep.sh: '$trainkit' is not a program (build it, or pass --trainkit)" >&2; exit 2; }
if ! [[ "$jobs" =~ ^[1-9][0-9]*$ ]]; then echo "sweep.sh: --jobs '$jobs' is not a positive integer" >&2; exit 2; fi
mkdir -p "$out"

names=()
runs=()
while read -r name rest; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  [[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "sweep.sh: $variants: bad variant name '$name'" >&2; exit 2; }
  names+=("$name")
  for seed in $seeds; do runs+=("$name|$seed|$rest"); done
done < "$variants"

run_one() {
  local name=$1 seed=$2 rest=$3 dir="$out/$1/seed-$2"
  [ -f "$dir/summary.json" ] && return 0
  local sets=(--set "train.seed=$seed")
  for kv in $rest; do sets+=(--set "$kv"); done
  mkdir -p "$out/$name"
  if ! "$trainkit" train --config "$config" "${common[@]}" "${sets[@]}" --out "$dir" --log-level warn \
      > "$dir.out" 2>&1; then
    echo "sweep.sh: $name seed $seed failed (exit $?): $dir.out" >&2
  fi
}
running=0
for r in "${runs[@]}"; do
  IFS='|' read -r name seed rest <<< "$r"
  echo "sweep.sh: $name seed $seed ($(date -u +%H:%M:%S))" >&2
  run_one "$name" "$seed" "$rest" &
  running=$((running + 1))
  if ((running >= jobs)); then wait -n || true; running=$((running - 1)); fi
done
wait || true

python3 - "$out" "$variants" "$seeds" "${names[@]}" <<'EOF'
import json, os, statistics, sys
out, variants, seeds, names = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
sets = {}
for line in open(variants):
    parts = line.split()
    if parts and not parts[0].startswith("#"):
        sets[parts[0]] = " ".join(parts[1:]) or "(base)"
rows, thresholds = [], []
for name in names:
    acc, wall, reach = [], [], {}
    for s in seeds:
        p = os.path.join(out, name, "seed-" + s, "summary.json")
        if not os.path.exists(p):
            acc.append(None)
            continue
        j = json.load(open(p))
        acc.append(j.get("test_accuracy"))
        wall.append(j.get("wall_seconds", float("nan")))
        for t in j.get("time_to_accuracy") or []:
            if t["threshold"] not in thresholds:
                thresholds.append(t["threshold"])
            reach.setdefault(t["threshold"], []).append(t["seconds"])
    rows.append((name, acc, wall, reach))
thresholds.sort()
fmt = lambda v: "–" if v is None else "{:.4f}".format(v)
print("| variant | overrides | test accuracy per seed ({}) | min / median / max | median wall s | {} |".format(
    ", ".join(seeds), " | ".join("val {:g} at s (runs)".format(t) for t in thresholds)))
print("|" + "---|" * (5 + len(thresholds)))
for name, acc, wall, reach in rows:
    got = [a for a in acc if a is not None]
    mmm = " / ".join(fmt(v) for v in (min(got), statistics.median(got), max(got))) if got else "–"
    cells = []
    for t in thresholds:
        secs = [x for x in reach.get(t, []) if x is not None]
        cells.append("{:.0f} ({}/{})".format(statistics.median(secs), len(secs), len(got)) if secs else "– (0/{})".format(len(got)))
    print("| {} | {} | {} | {} | {} | {} |".format(name, sets.get(name, ""), " / ".join(fmt(a) for a in acc), mmm,
          "{:.1f}".format(statistics.median(wall)) if wall else "–", " | ".join(cells)))
EOF
