#!/usr/bin/env bash
# The tuning benchmark of the main job (docs/tuning.md#three-methods-on-one-budget): three studies of the same
# budget over configs/tune/fashion_mnist_space.toml -- a Gaussian process with the median pruner, TPE with
# Hyperband, and random search without pruning -- then each study's best config and the default config trained
# at full length over several seeds. Prints one Markdown table.
# Usage: bench/tune_main_job.sh [options]
#   --trainkit BIN     the trainkit program (default: build/apps/trainkit)
#   --config FILE      the job tuned (default: configs/fashion_mnist.toml)
#   --out DIR          where the studies and runs go (default: runs/tune_bench); a study continues and a full
#                      run with a summary.json is not run again, so an interrupted benchmark goes on
#   --trials N         trials per study (default 24)
#   --epochs N         epochs of a trial that is not pruned (default 6)
#   --full-epochs N    epochs of the full-length runs (default: the config's)
#   --seeds "S ..."    seeds of the full-length runs (default "0 1 2")
#   --jobs K           trials (and full runs) at once (default 2)
#   --methods "M ..."  which of gp_median, tpe_hyperband, random (default: all three)
#   --set KEY=VALUE    an override of every trial and run (repeatable), e.g. --set train.device=cuda
# The objective is the validation accuracy after a trial's last epoch; every method has the same number of
# trials, so what pruning buys shows as epochs not spent. Needs python3 for the table.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
trainkit="$root/build/apps/trainkit"
config="$root/configs/fashion_mnist.toml"
space="$root/configs/tune/fashion_mnist_space.toml"
out=runs/tune_bench
trials=24
epochs=6
full_epochs=""
seeds="0 1 2"
jobs=2
methods="gp_median tpe_hyperband random"
common=()
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
while (($#)); do
  case "$1" in
    --trainkit) trainkit=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --trials) trials=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --full-epochs) full_epochs=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --methods) methods=$2; shift 2 ;;
    --set) common+=(--set "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "tune_main_job.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$trials" "$epochs" "$jobs" ${full_epochs:+"$full_epochs"}; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "tune_main_job.sh: '$n' is not a positive integer" >&2; exit 2; }
done
[ -x "$trainkit" ] || { echo "tune_main_job.sh: '$trainkit' is not a program (build it, or pass --trainkit)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
log() { echo "tune_main_job.sh [$(date -u +%H:%M:%S)] $*" >&2; }

for method in $methods; do
  study="$out/$method"
  args=(tune --config "$config" --trials "$trials" --jobs "$jobs" --out "$study" --metric val_accuracy
        --set "train.epochs=$epochs" "${common[@]}" --log-level warn)
  case "$method" in
    gp_median) args+=(--space "$space" --sampler gp --prune) ;;
    tpe_hyperband)
      # The same parameters; the space file's own keys choose TPE and Hyperband with Optuna's defaults.
      { printf 'sampler = "tpe"\npruner = "hyperband"\n\n'; cat "$space"; } > "$out/tpe_hyperband_space.toml"
      args+=(--space "$out/tpe_hyperband_space.toml") ;;
    random) args+=(--space "$space" --sampler random) ;;
    *) echo "tune_main_job.sh: unknown method '$method' (gp_median, tpe_hyperband, random)" >&2; exit 2 ;;
  esac
  if [ -f "$study/trials.csv" ] && (($(tail -n +2 "$study/trials.csv" | wc -l) >= trials)); then
    log "$method: the study holds $trials trials already (its time stays in $method.seconds)"
    continue
  fi
  log "$method: $trials trials of up to $epochs epochs"
  t0=$(date +%s.%N)
  "$trainkit" "${args[@]}" > "$out/$method.log" 2>&1 || { log "$method: trainkit tune failed: $out/$method.log"; exit 1; }
  t1=$(date +%s.%N)
  python3 -c "print(round($t1 - $t0, 1))" > "$out/$method.seconds"
done

# The full-length runs: the default config and each study's best trial's config (its best.toml, with the
# trials' epoch count put back), over the seeds, --jobs at once.
full=()
[ -n "$full_epochs" ] && full+=(--set "train.epochs=$full_epochs")
run_full() {  # name config extra-args...
  local name=$1 cfg=$2 seed=$3 dir="$out/full/$1/seed-$3"
  shift 3
  [ -f "$dir/summary.json" ] && return 0
  mkdir -p "$(dirname "$dir")"
  "$trainkit" train --config "$cfg" "${common[@]}" "$@" --set "train.seed=$seed" --out "$dir" --log-level warn \
    > "$dir.out" 2>&1 || log "full run $name seed $seed failed: $dir.out"
}
default_epochs=$(awk -F= '/^\[/ {s=$0} s=="[train]" && $1 ~ /^epochs[ \t]*$/ {gsub(/[ \t]/, "", $2); print $2}' "$config")
running=0
for name in default $methods; do
  if [ "$name" = default ]; then
    cfg=$config
    extra=("${full[@]}")
  else
    cfg="$out/$name/best.toml"
    # best.toml is the trial's effective config: its epochs are the trials'; the full run takes the config's.
    extra=(--set "train.epochs=${full_epochs:-${default_epochs:-12}}")
  fi
  for seed in $seeds; do
    log "full run: $name seed $seed"
    run_full "$name" "$cfg" "$seed" "${extra[@]}" &
    running=$((running + 1))
    if ((running >= jobs)); then wait -n || true; running=$((running - 1)); fi
  done
done
wait || true

python3 - "$out" "$seeds" "$epochs" default $methods <<'EOF'
import csv, glob, json, os, re, statistics, sys
out, seeds, max_epochs, names = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4:]
labels = {"default": "default config (no study)", "gp_median": "GP + median pruner",
          "tpe_hyperband": "TPE + Hyperband", "random": "random search"}
print("| method | trials complete / pruned / failed | epochs spent (of trials x {}) | study wall s | best trial: val "
      "accuracy, params | full-length test accuracy per seed ({}) | median |".format(max_epochs, ", ".join(seeds)))
print("|---|---|---|---|---|---|---|")
for name in names:
    cells = ["–", "–", "–", "–"]
    if name != "default":
        study = os.path.join(out, name)
        rows = list(csv.DictReader(open(os.path.join(study, "trials.csv"))))
        states = [r["state"] for r in rows]
        count = lambda s: sum(1 for x in states if x.lower() == s)
        epochs = 0
        for r in rows:
            m = os.path.join(study, r["dir"], "metrics.jsonl")
            if r["dir"] and os.path.exists(m):
                epochs += sum(1 for line in open(m) if '"kind":"epoch"' in line)
        best = max((r for r in rows if r["state"].lower() == "complete"), key=lambda r: float(r["val_accuracy"]))
        params = ", ".join("{} {:.3g}".format(k.split(".")[-1], float(v)) for k, v in best.items()
                           if k not in ("number", "state", "val_accuracy", "seconds", "dir"))
        cells = ["{} / {} / {}".format(count("complete"), count("pruned"), count("fail")),
                 "{} of {}".format(epochs, len(rows) * max_epochs),
                 open(os.path.join(out, name + ".seconds")).read().strip(),
                 "{:.4f} (trial {}): {}".format(float(best["val_accuracy"]), best["number"], params)]
    accs = []
    for s in seeds:
        p = os.path.join(out, "full", name, "seed-" + s, "summary.json")
        accs.append(json.load(open(p)).get("test_accuracy") if os.path.exists(p) else None)
    got = [a for a in accs if a is not None]
    print("| {} | {} | {} | {} |".format(labels.get(name, name), " | ".join(cells),
          " / ".join("–" if a is None else "{:.4f}".format(a) for a in accs),
          "{:.4f}".format(statistics.median(got)) if got else "–"))
EOF
