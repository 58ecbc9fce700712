#!/usr/bin/env bash
# Self-test of scripts/check_layers.sh: runs it on small fake trees in a temporary directory and checks that
# it rejects (a) an upward include written <trainkit/...> and (b) two areas of one layer that include each
# other, naming the files, and that it passes a tree that follows the rule.
# Usage: scripts/check_layers_selftest.sh [REPO_ROOT]      Exit status 1 when the checker misbehaves. Run by ctest.
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
checker="$root/scripts/check_layers.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

failures=0
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }

put() {  # tree, path under libtrainkit/, lines of the file
  local tree="$1" path="$2"
  shift 2
  mkdir -p "$(dirname "$tmp/$tree/libtrainkit/$path")"
  printf '%s\n' "$@" >"$tmp/$tree/libtrainkit/$path"
}

clean_tree() {  # a tree that follows the rule: downward includes in both spellings, one-way within a layer
  local tree="$1"
  put "$tree" include/trainkit/compat.h '#pragma once'
  put "$tree" include/trainkit/data/batch.h '#pragma once' '#include "trainkit/compat.h"'
  put "$tree" include/trainkit/nn/model.h '#pragma once' '#include "trainkit/data/batch.h"' '#include <torch/torch.h>'
  put "$tree" include/trainkit/log/metrics.h '#pragma once' '#include <trainkit/data/batch.h>'
  put "$tree" include/trainkit/optim/sgd.h '#pragma once' '#include <trainkit/nn/model.h>'
  put "$tree" include/trainkit/optim.h '#pragma once' '#include "trainkit/optim/sgd.h"'
  put "$tree" src/optim/detail/kernel.h '#pragma once'
  put "$tree" src/optim/sgd.cpp '#include "trainkit/optim/sgd.h"' '#include "optim/detail/kernel.h"'
  put "$tree" src/detail/check.h '#pragma once'
  put "$tree" src/data/batch.cpp '#include "trainkit/data/batch.h"' '#include "detail/check.h"'
  put "$tree" app/src/run.cpp '#include <trainkit/optim.h>'
}

run_checker() {  # tree -> output in $out, exit status in $rc
  rc=0
  out=$(bash "$checker" "$tmp/$1" 2>&1) || rc=$?
}

expect_fail() {  # tree, what it shows, strings the output must contain
  local tree="$1" what="$2"
  shift 2
  run_checker "$tree"
  if (( rc != 1 )); then
    fail "$what: the checker exited $rc, expected 1; its output:"$'\n'"$out"
    return
  fi
  local s
  for s in "$@"; do
    [[ "$out" == *"$s"* ]] || fail "$what: the output does not name \"$s\"; it is:"$'\n'"$out"
  done
}

# A clean tree passes.
clean_tree clean
run_checker clean
if (( rc != 0 )); then
  fail "clean tree: the checker exited $rc, expected 0; its output:"$'\n'"$out"
fi

# (a) data (layer 1) includes optim (layer 2) with angle brackets.
clean_tree upward
put upward include/trainkit/data/loader.h '#pragma once' '#include <trainkit/optim/sgd.h>'
expect_fail upward "<trainkit/...> upward include" \
  'include/trainkit/data/loader.h: includes <trainkit/optim/sgd.h> (layer 2: optim) from data (layer 1)'

# (b) data and nn (both layer 1) include each other; one of the two includes uses angle brackets.
clean_tree two_way
put two_way src/data/augment.cpp '#include "trainkit/data/batch.h"' '#include <trainkit/nn/model.h>'
expect_fail two_way "two-way include within a layer" \
  "two-way include within layer 1: data and nn include each other" \
  'src/data/augment.cpp: includes <trainkit/nn/model.h> (data -> nn)' \
  'include/trainkit/nn/model.h: includes "trainkit/data/batch.h" (nn -> data)'

# Both at once: each is reported.
clean_tree both
put both include/trainkit/data/loader.h '#pragma once' '#include <trainkit/optim/sgd.h>'
put both src/data/augment.cpp '#include <trainkit/nn/model.h>'
expect_fail both "both violations in one tree" \
  'include/trainkit/data/loader.h: includes <trainkit/optim/sgd.h>' \
  'src/data/augment.cpp: includes <trainkit/nn/model.h> (data -> nn)' \
  'include/trainkit/nn/model.h: includes "trainkit/data/batch.h" (nn -> data)'

if (( failures > 0 )); then
  echo "check_layers self-test: $failures failure(s)"
  exit 1
fi
echo "check_layers self-test: the checker rejects an upward <trainkit/...> include and a two-way include within a layer, and passes a clean tree"
