#!/usr/bin/env bash
# `trainkit tune` cases on a tiny config, one per call, each checked in the study's journal and outputs:
#   gp_maximize  4 trials with --startup-trials 1 on --metric val_accuracy: the study maximizes, best.toml is
#                the trial with the highest value, and each trial's effective config
#                (trials/<study>/trial-NNNN/config.toml) holds the values the journal records for it. Trials 0 and 1 are
#                design points (the GP models nothing before two finite values), trials 2 and 3 the Gaussian
#                process's: the same study with --startup-trials 4 (design points only) must give trials 0
#                and 1 the same values and trials 2 and 3 others
#   failed       every trial's `trainkit train` fails (no data): the trial ends FAIL, the study goes on and
#                exits 0
#   nan          every trial diverges (LR 1e30): a NaN objective ends the trial FAIL with no value
#   convert      a study directory of an older trainkit (study.jsonl: a complete and a failed trial) continued to
#                3 trials: the 2 are read once into study.journal (states, values, intermediate values, run
#                directories), one more runs, study.jsonl is left as it was, and a re-run reads nothing again
#   prune        a study continued from 5 complete trials (written as Optuna template trials) whose epoch-0
#                value is 0.01: --prune stops the new trial after its first epoch (PRUNED)
#   tpe_halving  as prune, with the space file choosing sampler = "tpe" (2 startup trials: the new trial is
#                TPE's) and pruner = "successive_halving" (min_resource 1, reduction_factor 2): the new trial,
#                worse than the 5 at epoch 1, is pruned there, and the journal records it PRUNED with its
#                epoch-1 value (Optuna's rule), not null
#   two_studies  two studies in one --out at once (--study-name a and b, 2 trials each, so that both number
#                trials 0 and 1): every trial keeps a run directory of its own, complete, whose effective config
#                holds the values the journal records for that trial (none removed or overwritten by the other
#                study's trial of the same number); each study's trials.csv (trials/<study>/trials.csv: neither
#                is named after --out) lists its own 2 trials
# Usage: run_tune_cases.sh CASE CLI CONFIG SPACE DIVERGE_SPACE OUT [--set ... (a tiny config)]
set -euo pipefail
case_name=$1 cli=$2 config=$3 space=$4 diverge_space=$5 out=$6
shift 6
rm -rf "$out"
mkdir -p "$out"
journal=$out/study.journal
fail() { echo "app_tune_case_$case_name: $*"; for log in "$out"/*.log; do echo "--- $log"; cat "$log"; done; exit 1; }
tune() { "$cli" tune --config "$config" --out "$out" --jobs 1 "$@" > "$out/tune.log" 2>&1 || fail "tune exited $?"; }
# A study continued from 5 complete trials written as Optuna template trials, each 0.01 at epochs 0 and 1.
template_study() {
  name=$(basename "$out")
  dist_lr='{\"name\":\"FloatDistribution\",\"attributes\":{\"step\":null,\"low\":0.0001,\"high\":0.01,\"log\":true}}'
  dist_wd='{\"name\":\"FloatDistribution\",\"attributes\":{\"step\":null,\"low\":0.0,\"high\":0.001,\"log\":false}}'
  echo "{\"op_code\":0,\"worker_id\":\"w\",\"study_name\":\"$name\",\"directions\":[1]}" > "$journal"
  for i in 0 1 2 3 4; do
    echo "{\"op_code\":4,\"worker_id\":\"w\",\"study_id\":0,\"datetime_start\":\"2026-01-01T00:00:0$i.000000+00:00\",\"datetime_complete\":\"2026-01-01T00:00:0$i.500000+00:00\",\"state\":1,\"value\":0.01,\"values\":[0.01],\"distributions\":{\"optimizer.lr\":\"$dist_lr\",\"optimizer.weight_decay\":\"$dist_wd\"},\"params\":{\"optimizer.lr\":0.00$((i + 1)),\"optimizer.weight_decay\":0.0},\"user_attrs\":{},\"system_attrs\":{},\"intermediate_values\":{\"0\":0.01,\"1\":0.01}}" >> "$journal"
  done
}
ends() { grep '"op_code":6,' "$journal" | grep -c "\"state\":$1," || true; }

case $case_name in
  gp_maximize)
    tune --space "$space" --trials 4 --startup-trials 1 --metric val_accuracy --seed 5 "$@"
    grep -q '"directions":\[2\]' "$journal" || fail "the study does not maximize"
    [ "$(ends 1)" -eq 4 ] || fail "$(ends 1) complete trials, expected 4"
    # The design-only study: the same seed, every trial a design point.
    gp_out=$out; out=$out/design
    mkdir -p "$out"
    tune --space "$space" --trials 4 --startup-trials 4 --metric val_accuracy --seed 5 "$@"
    out=$gp_out
    params() { awk -F, -v n="$2" 'NR > 1 && $1 == n { print $4 "," $5 }' "$1/trials.csv"; }
    for n in 0 1 2 3; do
      gp=$(params "$out" $n) design=$(params "$out/design" $n)
      [ -n "$gp" ] && [ -n "$design" ] || fail "trial $n missing from a trials.csv"
      if [ "$n" -lt 2 ] && [ "$gp" != "$design" ]; then fail "trial $n ($gp) is not the design point $design"; fi
      if [ "$n" -ge 2 ] && [ "$gp" = "$design" ]; then fail "trial $n ($gp) is the design point: the GP did not pick it"; fi
    done
    best=$(awk -F, 'NR > 1 && $2 == "complete" && ($3 > max || max == "") { max = $3; n = $1 } END { print n }' \
      "$out/trials.csv")
    grep -q "^# The best trial of the study in .*: trial $best, val_accuracy" "$out/best.toml" ||
      fail "best.toml is not trial $best, the highest val_accuracy in trials.csv"
    while IFS=, read -r number state value lr wd seconds dir; do
      [ "$number" = number ] && continue
      grep -qx "lr = $lr" "$out/$dir/config.toml" || fail "trial $number ran without optimizer.lr = $lr"
      grep -qx "weight_decay = $wd" "$out/$dir/config.toml" || fail "trial $number ran without weight_decay = $wd"
      grep -q "\"optimizer.lr=$lr\"" "$journal" || fail "the journal's overrides lack optimizer.lr=$lr"
    done < "$out/trials.csv"
    ;;
  failed)
    tune --space "$space" --trials 2 --set data.dir=/nonexistent/trainkit-no-data "$@"
    [ "$(ends 3)" -eq 2 ] || fail "$(ends 3) failed trials, expected 2"
    grep -q "trial 0 failed (exit code 1)" "$out/tune.log" || fail "the failure is not reported"
    [ "$(grep -c ',failed,' "$out/trials.csv")" -eq 2 ] || fail "trials.csv does not list 2 failed trials"
    ;;
  nan)
    tune --space "$diverge_space" --trials 1 "$@"
    grep '"op_code":6,' "$journal" | grep -q '"state":3,"values":null' || fail "the NaN trial is not FAIL without a value"
    grep -q "no finite val_loss" "$out/tune.log" || fail "the NaN objective is not reported"
    ;;
  convert)
    fingerprint='optimizer.lr:float:log:[0.0001,0.01];optimizer.weight_decay:float:linear:[0,0.001]'
    {
      echo "{\"trainkit_study\":1,\"space\":\"$fingerprint\",\"metric\":\"val_loss\",\"direction\":\"minimize\",\"seed\":0}"
      echo '{"number":0,"state":"complete","value":0.5,"seconds":1.5,"dir":"trials/trial-0000","params":{"optimizer.lr":"0.001","optimizer.weight_decay":"0.0001"},"intermediate":[[0,0.5]]}'
      echo '{"number":1,"state":"failed","value":null,"seconds":0.5,"dir":"trials/trial-0001","params":{"optimizer.lr":"0.002","optimizer.weight_decay":"0"},"intermediate":[]}'
    } > "$out/study.jsonl"
    cp "$out/study.jsonl" "$out/old.jsonl"
    tune --space "$space" --trials 3 "$@"
    grep -q "read 2 trials of .*study.jsonl into" "$out/tune.log" || fail "study.jsonl was not read into the journal"
    [ "$(grep -c '"op_code":4,' "$journal")" -eq 3 ] || fail "the journal does not hold 2 read + 1 new trials"
    grep '"op_code":4,' "$journal" | head -1 | grep -q '"optimizer.lr":0.001,.*"trainkit_dir":"trials/trial-0000"' ||
      fail "trial 0 was not read with its parameters and run directory"
    grep -q '"trial_id":0,"step":0,"intermediate_value":0.5}' "$journal" || fail "trial 0's intermediate value was lost"
    grep -q '"trial_id":0,"state":1,"values":\[0.5\]' "$journal" || fail "trial 0 is not COMPLETE with 0.5"
    grep -q '"trial_id":1,"state":3,"values":null' "$journal" || fail "trial 1 is not FAIL"
    cmp -s "$out/study.jsonl" "$out/old.jsonl" || fail "study.jsonl was changed"
    tune --space "$space" --trials 3 "$@"
    [ "$(grep -c '"op_code":4,' "$journal")" -eq 3 ] || fail "a re-run read study.jsonl again"
    ;;
  prune)
    template_study
    tune --space "$space" --trials 6 --prune "$@" --set train.epochs=2
    grep '"op_code":6,' "$journal" | grep -q '"trial_id":5,"state":2,' || fail "trial 5 was not pruned"
    grep -q "trial 5 pruned at epoch 0" "$out/tune.log" || fail "the pruning is not reported"
    ;;
  tpe_halving)
    template_study
    { printf 'sampler = "tpe"\npruner = "successive_halving"\n[tpe]\nn_startup_trials = 2\n'
      printf '[successive_halving]\nmin_resource = 1\nreduction_factor = 2\n'; cat "$space"; } > "$out/space.toml"
    tune --space "$out/space.toml" --trials 6 "$@" --set train.epochs=2
    grep '"op_code":6,' "$journal" | grep -q '"trial_id":5,"state":2,"values":\[[0-9]' ||
      fail "trial 5 was not pruned with its last value"
    grep -q "trial 5 pruned at epoch 1" "$out/tune.log" || fail "the pruning at epoch 1 is not reported"
    ;;
  two_studies)
    study() {
      "$cli" tune --config "$config" --out "$out" --jobs 1 --space "$space" --trials 2 --study-name "$1" "${@:2}" \
        > "$out/$1.log" 2>&1
    }
    study a "$@" & first=$!
    study b "$@" & second=$!
    wait "$first" || fail "study a exited with an error"
    wait "$second" || fail "study b exited with an error"
    [ "$(grep -c '"op_code":4,' "$journal")" -eq 4 ] || fail "the journal does not hold 2 + 2 trials"
    dirs=$(grep -o '"trainkit_dir":"[^"]*"' "$journal" | sort -u | wc -l)
    [ "$dirs" -eq 4 ] || fail "$dirs distinct run directories for 4 trials of 2 studies"
    while IFS= read -r line; do
      dir=$(grep -o '"trainkit_dir":"[^"]*"' <<< "$line" | cut -d'"' -f4)
      lr=$(grep -o '"optimizer.lr=[^"]*"' <<< "$line" | tr -d '"' | cut -d= -f2)
      [ -f "$out/$dir/summary.json" ] || fail "$dir has no summary.json (removed by the other study?)"
      grep -qx "lr = $lr" "$out/$dir/config.toml" || fail "$dir/config.toml is not the trial with optimizer.lr = $lr"
    done < <(grep '"op_code":4,' "$journal")
    for s in a b; do
      grep -q "\"trainkit_dir\":\"trials/$s/trial-0001\"" "$journal" || fail "study $s's trial 1 is not in trials/$s/"
      [ "$(grep -c ",trials/$s/trial-000[01]\$" "$out/trials/$s/trials.csv")" -eq 2 ] &&
        [ "$(wc -l < "$out/trials/$s/trials.csv")" -eq 3 ] || fail "trials/$s/trials.csv does not list study $s's 2 trials"
      [ -f "$out/trials/$s/best.toml" ] || fail "no trials/$s/best.toml"
    done
    [ ! -e "$out/trials.csv" ] || fail "trials.csv written in --out by a study not named after it"
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
echo "app_tune_case_$case_name passed"
