#!/usr/bin/env bash
# Checks the dependency rule of docs/architecture.md on every #include of libtrainkit, whether written
# "trainkit/..." or <trainkit/...>:
# - no area includes a higher layer (the core includes nothing of the application layer, trainkit/app/);
# - no area includes another area's internal detail/ headers;
# - two areas of the same layer do not include each other (A includes B and B includes A): within a layer
#   the dependencies go one way, so that the two areas could be told apart by a layer boundary.
# Prints every violation: FILE: includes "X" (layer L: B) from A (layer K), with the include as written, and
# for a two-way pair one line naming the pair and one line per file that includes the other area.
# Usage: scripts/check_layers.sh [REPO_ROOT]      Exit status 1 when a violation is found. Run by ctest.
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root/libtrainkit"

# Layer of each area, lowest first (docs/architecture.md). Top-level headers (compat.h, args.h, options.h,
# features.h, version.h, subprocess.h) and the neutral internal folder src/detail/ are layer 0; the umbrella
# trainkit.h includes every core area; the application layer (libtrainkit/app) is above all of them.
declare -A layer=([compat]=0 [args]=0 [options]=0 [features]=0 [version]=0 [subprocess]=0 [detail]=0
                  [data]=1 [nn]=1 [log]=1 [io]=1 [optim]=2 [sched]=3 [grad]=4 [amp]=4
                  [tune]=5 [train]=5 [dist]=6 [trainkit]=7 [app]=8)

area_of_include() {  # "trainkit/optim/adam.h" -> optim; "trainkit/optim.h" -> optim; "optim/detail/x.h" -> optim
  local inc="$1"
  inc="${inc#trainkit/}"
  inc="${inc%%/*}"
  echo "${inc%.h}"
}

includes_of() {  # the `#include "..."` and `#include <trainkit/...>` of a file as written ("x" or <x>), one a line
  sed -nE -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*("[^"]+").*/\1/p' \
          -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*(<trainkit\/[^>]+>).*/\1/p' "$1"
}

status=0
report() { echo "$1"; status=1; }

# Same-layer includes between two different areas, "FROM TO FILE INCLUDE" a line, for the two-way check.
declare -a sideways=()

check_file() {  # file, its area
  local file="$1" area="$2" written inc dep
  while IFS= read -r written; do
    inc="${written:1:${#written}-2}"
    dep=$(area_of_include "$inc")
    [[ -n "${layer[$dep]+x}" ]] || continue
    if (( ${layer[$dep]} > ${layer[$area]} )); then
      report "$file: includes $written (layer ${layer[$dep]}: $dep) from $area (layer ${layer[$area]})"
    elif (( ${layer[$dep]} == ${layer[$area]} )) && [[ "$dep" != "$area" ]]; then
      sideways+=("$area $dep $file $written")
    fi
    if [[ "$inc" == */detail/* && "$inc" != detail/* && "$dep" != "$area" ]]; then
      report "$file: includes another area's internals $written"
    fi
  done < <(includes_of "$file")
}

for dir in include/trainkit/*/ src/*/; do
  [[ -d "$dir" ]] || continue
  area=$(basename "$dir")
  [[ -n "${layer[$area]+x}" ]] || { report "$dir: area '$area' has no layer in scripts/check_layers.sh"; continue; }
  while IFS= read -r file; do check_file "$file" "$area"; done < <(find "$dir" -name '*.h' -o -name '*.cpp')
done
for file in include/trainkit/*.h src/*.cpp; do
  [[ -e "$file" ]] || continue
  name=$(basename "$file"); name="${name%.*}"  # an area's umbrella header (optim.h) is checked as that area
  [[ -n "${layer[$name]+x}" ]] || { report "$file: '$name' has no layer in scripts/check_layers.sh"; continue; }
  check_file "$file" "$name"
done
if [[ -d app ]]; then
  while IFS= read -r file; do check_file "$file" app; done < <(find app -name '*.h' -o -name '*.cpp')
fi

# Two-way includes within a layer: every pair {A, B} with an include A -> B and one B -> A, with the files.
declare -A seen_pair=()
for entry in "${sideways[@]+"${sideways[@]}"}"; do
  read -r from to _ _ <<<"$entry"
  [[ "$from" < "$to" ]] || continue
  pair="$from $to"
  [[ -z "${seen_pair[$pair]+x}" ]] || continue
  back=0
  for other in "${sideways[@]}"; do
    read -r f t _ _ <<<"$other"
    if [[ "$f" == "$to" && "$t" == "$from" ]]; then back=1; break; fi
  done
  (( back )) || continue
  seen_pair[$pair]=1
  report "two-way include within layer ${layer[$from]}: $from and $to include each other"
  for other in "${sideways[@]}"; do
    read -r f t file inc <<<"$other"
    if [[ ( "$f" == "$from" && "$t" == "$to" ) || ( "$f" == "$to" && "$t" == "$from" ) ]]; then
      echo "  $file: includes $inc ($f -> $t)"
    fi
  done
done

if (( status == 0 )); then
  echo "layers: every include of libtrainkit follows the dependency rule"
fi
exit $status
