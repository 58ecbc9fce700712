#!/usr/bin/env bash
# Configures and builds trainkit against the LibTorch inside the project's virtual environment.
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]   (BUILD_DIR defaults to build/)
# Environment: TRAINKIT_JOBS (parallel jobs, 2), TRAINKIT_BUILD_TYPE (Release), TRAINKIT_TARGETS (only these),
#   TRAINKIT_CXX (the C++ compiler of a new build directory; CMake's default, GCC on Debian, when unset).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${1:-$root/build}"
shift || true
venv="${TRAINKIT_VENV:-$root/.venv}"
# torch.utils.cmake_prefix_path without importing torch (seconds of CPU, and a NumPy warning while the oracles
# are still being installed).
torch_prefix=$("$venv/bin/python" -c \
  "import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec('torch').origin), 'share', 'cmake'))")

cuda_args=()
# The wheel's LibTorch is a CUDA build: its CMake config needs the CUDA toolkit even to build CPU code.
if [ -z "${CUDAToolkit_ROOT:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda_args+=(-DCUDAToolkit_ROOT=/usr/local/cuda -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
compiler_args=()
if [ -n "${TRAINKIT_CXX:-}" ]; then compiler_args+=(-DCMAKE_CXX_COMPILER="$TRAINKIT_CXX"); fi

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE="${TRAINKIT_BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$torch_prefix" "${cuda_args[@]}" "${compiler_args[@]}" "$@"
fi
targets=()
if [ -n "${TRAINKIT_TARGETS:-}" ]; then read -r -a targets <<< "--target $TRAINKIT_TARGETS"; fi
cmake --build "$build" -j "${TRAINKIT_JOBS:-2}" "${targets[@]}"
