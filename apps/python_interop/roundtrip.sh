#!/usr/bin/env bash
# The three steps of apps/python_interop on small settings (the ctest python_interop_roundtrip): pretrain in
# Python, fine-tune in C++, evaluate in Python; fails unless Python's accuracies (via torch.jit.load and via
# safetensors into the Python class) equal the C++ one.
# Usage: roundtrip.sh PYTHON PYTHON_INTEROP_APP DIR
set -euo pipefail
py=$1 app=$2 dir=$3
[ -x "$py" ] || { echo "trainkit-skip: no Python at $py"; exit 0; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$dir"
mkdir -p "$dir"
"$py" -W ignore "$here/pretrain.py" --out "$dir" --limit-train 2000
"$app" --model "$dir/pretrained.pt" --out "$dir" --limit-train 3000 --val-size 500 --epochs 1 | tee "$dir/cpp.txt"
acc=$(sed -n 's/^C++: fine-tuned .* test accuracy \([0-9.]*\)$/\1/p' "$dir/cpp.txt")
[ -n "$acc" ] || { echo "no C++ test accuracy in the app's output" >&2; exit 1; }
"$py" -W ignore "$here/evaluate.py" --dir "$dir" --expect "$acc"
