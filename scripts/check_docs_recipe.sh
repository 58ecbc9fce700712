#!/usr/bin/env bash
# Checks that the code block of docs/training.md's section "The recipe with the library alone" equals, byte
# for byte, the region of apps/custom_data/recipe.cpp between the lines "// docs recipe begin" and
# "// docs recipe end". custom_data compiles recipe.cpp and `custom_data --recipe` runs it, so the page shows
# code that builds and trains. Prints the difference (the page first) when they drift.
# Usage: scripts/check_docs_recipe.sh [REPO_ROOT]      Exit status 1 on a difference. Run by ctest.
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
doc="$root/docs/training.md"
recipe="$root/apps/custom_data/recipe.cpp"
section="### The recipe with the library alone"

doc_block() {  # the first ```cpp block after the section heading
  awk -v section="$section" '$0 == section { in_section = 1; next }
       in_section && /^#+ / { exit }
       in_section && !in_block && /^```cpp( fragment)?$/ { in_block = 1; next }
       in_block && /^```$/ { exit }
       in_block { print }' "$doc"
}
recipe_region() {
  awk '/^\/\/ docs recipe begin$/ { inside = 1; next }
       /^\/\/ docs recipe end$/ { exit }
       inside { print }' "$recipe"
}

if [ -z "$(recipe_region)" ]; then
  echo "$recipe: no lines between \"// docs recipe begin\" and \"// docs recipe end\""
  exit 1
fi
if [ -z "$(doc_block)" ]; then
  echo "$doc: no \`\`\`cpp code block in the section \"$section\""
  exit 1
fi
if ! diff -u --label "docs/training.md ($section)" --label "apps/custom_data/recipe.cpp (docs recipe)" \
    <(doc_block) <(recipe_region); then
  echo "docs/training.md's recipe differs from apps/custom_data/recipe.cpp: copy the compiled region into the page"
  exit 1
fi
echo "docs/training.md's recipe equals apps/custom_data/recipe.cpp's marked region ($(recipe_region | wc -l) lines)"
