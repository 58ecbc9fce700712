#!/usr/bin/env bash
# Regenerates the key table of docs/config.md from `trainkit train --list-keys` (a test checks it).
# Usage: scripts/update_config_doc.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${1:-$root/build}"
doc="$root/docs/config.md"
head=$(sed '/^| key | type/,$d' "$doc")
{ printf '%s\n\n' "$head"; "$build/apps/trainkit" train --list-keys; } > "$doc.tmp"
mv "$doc.tmp" "$doc"
