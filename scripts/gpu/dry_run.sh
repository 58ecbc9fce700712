#!/usr/bin/env bash
# Runs scripts/gpu/run.sh on a machine without a GPU as if it had N of them, to check the script's own logic
# before a GPU machine's minutes are spent on it: with an existing build (run.sh --no-build) and PyTorch's
# device count reported as N, the steps that only a GPU machine reaches run here. What they should show:
# every [cuda] case that skips fails `cuda_tests`, `host_transfers` fails on its skip, each GPU run
# (`main_job`, `ddp_nccl`) fails for lack of a device with its log in the results, and `ddp_gloo` (with
# N >= 2) trains on the CPU and passes its summary.json checks. The exit status is run.sh's (1 here).
# Usage: scripts/gpu/dry_run.sh [--gpus N] [--venv DIR] BUILD_DIR [run.sh arguments...]
#   --gpus N     the device count to report (default 2)
#   --venv DIR   the virtual environment with torch (default: .venv)
#   BUILD_DIR    a build with trainkit_tests and trainkit (scripts/build.sh); missing programs are recorded
# The data set comes from gpu-deps/ when pack.sh filled it, else from Debian's folder. Example, 1 epoch:
#   scripts/gpu/dry_run.sh build --epochs 1 --budget 900 /tmp/dry-run-results
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
gpus=2
venv="$root/.venv"
while (($#)); do
  case "$1" in
    --gpus) gpus=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) break ;;
  esac
done
if (($# < 1)); then echo "dry_run.sh: BUILD_DIR is required (see --help)" >&2; exit 2; fi
if ! [[ "$gpus" =~ ^[0-9]+$ ]]; then echo "dry_run.sh: --gpus '$gpus' is not a count" >&2; exit 2; fi
build=$(cd "$1" && pwd)
shift
python=$(cd "$venv/bin" && pwd)/python
[ -x "$python" ] || { echo "dry_run.sh: $python not found" >&2; exit 2; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The Python run.sh asks for PyTorch's device count, answering N for that one query.
cat > "$scratch/python" <<EOF
#!/usr/bin/env bash
if [ "\${1:-}" = "-c" ] && [[ "\${2:-}" == *device_count* ]]; then
  out=\$("$python" "\$@") || exit \$?
  echo "\$out" | awk 'NR == 1 { \$3 = $gpus } { print }'
  exit 0
fi
exec "$python" "\$@"
EOF
chmod +x "$scratch/python"
deps="$root/gpu-deps"
if [ ! -d "$deps/fashion-mnist" ]; then
  deps="$scratch/deps"
  mkdir -p "$deps"
  ln -s /usr/share/datasets/fashion-mnist "$deps/fashion-mnist"
fi
TRAINKIT_PYTHON="$scratch/python" bash "$root/scripts/gpu/run.sh" --no-build --build-dir "$build" --deps "$deps" "$@"
