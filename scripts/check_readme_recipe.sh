#!/usr/bin/env bash
# Checks that the code block of README.md's "Using the library" section equals, byte for byte, the region
# of apps/custom_data/recipe.cpp between the lines "// README recipe begin" and "// README recipe end".
# custom_data compiles recipe.cpp and `custom_data --recipe` runs it, so the README shows code that
# builds and trains. Prints the difference (README first) when they drift.
# Usage: scripts/check_readme_recipe.sh [REPO_ROOT]      Exit status 1 on a difference. Run by ctest.
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
readme="$root/README.md"
recipe="$root/apps/custom_data/recipe.cpp"

readme_block() {  # the first ```cpp block after the section heading
  awk '/^## Using the library$/ { in_section = 1; next }
       in_section && /^## / { exit }
       in_section && !in_block && /^```cpp( fragment)?$/ { in_block = 1; next }
       in_block && /^```$/ { exit }
       in_block { print }' "$readme"
}
recipe_region() {
  awk '/^\/\/ README recipe begin$/ { inside = 1; next }
       /^\/\/ README recipe end$/ { exit }
       inside { print }' "$recipe"
}

if [ -z "$(recipe_region)" ]; then
  echo "$recipe: no lines between \"// README recipe begin\" and \"// README recipe end\""
  exit 1
fi
if [ -z "$(readme_block)" ]; then
  echo "$readme: no \`\`\`cpp code block in the section \"## Using the library\""
  exit 1
fi
if ! diff -u --label "README.md (Using the library)" --label "apps/custom_data/recipe.cpp (README recipe)" \
    <(readme_block) <(recipe_region); then
  echo "README.md's recipe differs from apps/custom_data/recipe.cpp: copy the compiled region into the README"
  exit 1
fi
echo "README.md's recipe equals apps/custom_data/recipe.cpp's marked region ($(recipe_region | wc -l) lines)"
