#!/usr/bin/env bash
# Builds trainkit and runs ctest against the LibTorch of another PyTorch wheel (the check behind the
# list of tested LibTorch versions in docs/testing.md).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/compat.sh [--no-test] [--reinstall] VERSION [ctest args...]

Builds trainkit (library, application layer, CLI, apps, benchmarks, tests) against the LibTorch inside
the PyPI wheel torch==VERSION and runs ctest, each version in a folder of its own:
  .venv-torch-VERSION/    a virtual environment holding only that wheel (its LibTorch is what the build links)
  build-torch-VERSION/    the build folder (clang++ as in scripts/test.sh; TRAINKIT_CXX to change it)
VERSION is a release such as 2.4.1, or MAJOR.MINOR for its newest patch release (2.4 -> torch==2.4.*).

The tests' Python oracles (PyTorch, TensorBoard, Optuna, MLflow ...) stay the project's own .venv/ with
the pinned wheel that scripts/setup.sh installs (run first): only the C++ side changes version.

Options:
  --no-test     build only
  --reinstall   recreate the version's virtual environment and build folder
  -h, --help    this text
Environment: TRAINKIT_JOBS (parallel jobs, 2), TRAINKIT_CXX (clang++), CUDAToolkit_ROOT (the CUDA toolkit
for a CUDA wheel; default /usr/local/cuda when it exists).

A CUDA wheel's CMake config needs a CUDA toolkit (nvcc and headers) even for CPU code. A CUDA 12 wheel
(torch < 2.7 or so) also needs libnvToolsExt, which CUDA 13 toolkits lack: the build then takes the
wheel's own copy (cmake/TrainkitWheelNvtx.cmake).
EOF
}

run_tests=1
reinstall=0
version=""
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --no-test) run_tests=0; shift ;;
    --reinstall) reinstall=1; shift ;;
    -*) if [ -n "$version" ]; then break; fi
        echo "compat: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) if [ -n "$version" ]; then break; fi
       version="$1"; shift ;;
  esac
done
if [ -z "$version" ]; then
  echo "compat: no VERSION given (e.g. scripts/compat.sh 2.4.1; see --help)" >&2
  exit 2
fi
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]]; then
  echo "compat: VERSION must look like 2.4.1 or 2.4, got '$version'" >&2
  exit 2
fi
spec="torch==$version"
if [[ "$version" =~ ^[0-9]+\.[0-9]+$ ]]; then spec="torch==$version.*"; fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv-torch-$version"
build="$root/build-torch-$version"

# Debian packages and the project's own .venv/ (the tests' Python oracles).
"$root/scripts/setup.sh"
if [ ! -x "$root/.venv/bin/python" ]; then
  echo "compat: $root/.venv/bin/python is missing after scripts/setup.sh (the tests' Python)" >&2
  exit 1
fi

if ((reinstall)); then rm -rf "$venv" "$build"; fi
if [ ! -x "$venv/bin/python" ]; then
  echo "compat: creating $venv"
  py=python3
  if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; fi
  "$py" -m venv "$venv"
fi
installed=$("$venv/bin/python" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)
if [ -z "$installed" ] || { [ "$installed" != "$version" ] && [[ "$installed" != "$version".* ]]; }; then
  echo "compat: installing $spec into $venv"
  if ! "$venv/bin/python" -m pip install -q "$spec"; then
    echo "compat: pip could not install $spec for $("$venv/bin/python" -V) (no wheel for this Python?)" >&2
    exit 1
  fi
fi
read -r torch_version torch_cuda torch_abi < <("$venv/bin/python" -c \
  "import torch; print(torch.__version__, torch.version.cuda or 'none', int(torch.compiled_with_cxx11_abi()))")
echo "compat: torch $torch_version (CUDA: $torch_cuda, C++11 ABI: $torch_abi) from $venv"

cmake_args=()
if [ "$torch_cuda" != none ]; then
  toolkit="${CUDAToolkit_ROOT:-}"
  if [ -z "$toolkit" ] && [ -x /usr/local/cuda/bin/nvcc ]; then toolkit=/usr/local/cuda; fi
  if [ -z "$toolkit" ] || [ ! -x "$toolkit/bin/nvcc" ]; then
    echo "compat: torch $torch_version is a CUDA $torch_cuda build, whose CMake config needs a CUDA toolkit;" \
         "set CUDAToolkit_ROOT to one (no nvcc found${toolkit:+ in $toolkit/bin})" >&2
    exit 1
  fi
  toolkit_version=$("$toolkit/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
  echo "compat: CUDA toolkit $toolkit_version at $toolkit (the wheel's CUDA: $torch_cuda)"
  cmake_args+=(-DCUDAToolkit_ROOT="$toolkit" -DCMAKE_CUDA_COMPILER="$toolkit/bin/nvcc")
fi

export TRAINKIT_CXX="${TRAINKIT_CXX:-clang++}"
start=$SECONDS
# build.sh configures a new build folder with the LibTorch of TRAINKIT_VENV; the CUDA arguments are ours.
CUDAToolkit_ROOT="${toolkit:-}" TRAINKIT_VENV="$venv" "$root/scripts/build.sh" "$build" "${cmake_args[@]}"
echo "compat: built against torch $torch_version in $((SECONDS - start)) s ($build)"
if ((run_tests == 0)); then exit 0; fi

cd "$build"
start=$SECONDS
rc=0
ctest --output-on-failure -j "${TRAINKIT_JOBS:-2}" "$@" || rc=$?
echo "compat: ctest against torch $torch_version took $((SECONDS - start)) s (exit code $rc)"
exit "$rc"
