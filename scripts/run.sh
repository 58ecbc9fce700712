#!/usr/bin/env bash
# Sets up what is missing, builds trainkit (Release) and runs the main job:
#   trainkit train --config configs/fashion_mnist.toml
# Extra arguments go to `trainkit train` (e.g. --out runs/mine --set train.epochs=3).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${TRAINKIT_BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$build"
cd "$root"
exec "$build/apps/trainkit" train --config configs/fashion_mnist.toml "$@"
