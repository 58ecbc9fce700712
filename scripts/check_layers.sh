#!/usr/bin/env bash
# Checks the dependency rule of docs/architecture.md: no area of libtrainkit includes a higher layer, no area
# includes another area's internal detail/ headers, and the core includes nothing of the application
# layer (trainkit/app/). Prints every violation as FILE: includes X (layer L) from AREA (layer K).
# Usage: scripts/check_layers.sh [REPO_ROOT]      Exit status 1 when a violation is found. Run by ctest.
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root/libtrainkit"

# Layer of each area, lowest first (docs/architecture.md). Top-level headers (compat.h, args.h,
# features.h, version.h, subprocess.h) and the neutral internal folder src/detail/ are layer 0; the umbrella
# trainkit.h includes every core area; the application layer (libtrainkit/app) is above all of them.
declare -A layer=([compat]=0 [args]=0 [features]=0 [version]=0 [subprocess]=0 [detail]=0
                  [data]=1 [nn]=1 [log]=1 [optim]=2 [sched]=3 [grad]=4 [amp]=4
                  [tune]=5 [train]=5 [dist]=6 [trainkit]=7 [app]=8)

area_of_include() {  # "trainkit/optim/adam.h" -> optim; "trainkit/optim.h" -> optim; "optim/detail/x.h" -> optim
  local inc="$1"
  inc="${inc#trainkit/}"
  inc="${inc%%/*}"
  echo "${inc%.h}"
}

status=0
report() { echo "$1"; status=1; }

check_file() {  # file, its area
  local file="$1" area="$2" inc dep
  while IFS= read -r inc; do
    dep=$(area_of_include "$inc")
    [[ -n "${layer[$dep]+x}" ]] || continue
    if (( ${layer[$dep]} > ${layer[$area]} )); then
      report "$file: includes \"$inc\" (layer ${layer[$dep]}: $dep) from $area (layer ${layer[$area]})"
    fi
    if [[ "$inc" == */detail/* && "$inc" != detail/* && "$dep" != "$area" ]]; then
      report "$file: includes another area's internals \"$inc\""
    fi
  done < <(grep -hoE '^#include "[^"]+"' "$file" | sed -E 's/#include "(.*)"/\1/')
}

for dir in include/trainkit/*/ src/*/; do
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
while IFS= read -r file; do check_file "$file" app; done < <(find app -name '*.h' -o -name '*.cpp')
if (( status == 0 )); then
  echo "layers: every include of libtrainkit follows the dependency rule"
fi
exit $status
