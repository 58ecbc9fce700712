#!/usr/bin/env bash
# Installs everything trainkit needs on Debian 12 (bookworm); idempotent: skips what is present.
# Usage: scripts/setup.sh [--fuzz] [--bench-peers] [--build-only | --oracles-only]
#   --fuzz: also clang and libFuzzer, for scripts/fuzz.sh
#   --build-only: what the build needs (Debian packages, the venv with torch); --oracles-only: the rest (the
#     Python oracles, byte-compiled), which scripts/test.sh installs while the build runs
#   --bench-peers: also DeepSpeed (its CPU Adam, bench_optim --deepspeed's peer; not used by any test)
#   - Debian packages: build dependencies and the Fashion-MNIST data set.
#   - A project-local virtual environment (.venv/) with the pinned `torch` wheel (LibTorch for the C++
#     build; Python PyTorch as the test oracle and speed peer) and the test-only oracles.
# Python is only used to regenerate golden files and to run benchmarks' peers, never at run time.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
part=all
if [[ " $* " == *" --build-only "* ]]; then part=build; fi
if [[ " $* " == *" --oracles-only "* ]]; then part=oracles; fi
venv="${TRAINKIT_VENV:-$root/.venv}"
torch_version="2.15.0"
# optuna-dashboard (two pure-Python wheels, with bottle; about 9 MB) serves a `trainkit tune` journal in the
# ctest optuna_dashboard_serves_journal.
# mlflow (the tracking server and its Python client) serves and reads back a run in the ctest
# mlflow_server_receives_run; flask-wtf (mlflow's "auth" extra, with wtforms) lets `mlflow server --app-name
# basic-auth` start for the credentials test in tests/log/test_mlflow_faults.cpp.
# Pinned: the golden files record what these versions compute (tests/golden/optuna.toml names Optuna's), so
# a fresh machine must get the same ones; scripts/check_golden.py's golden_files_fresh fails on a drift.
python_oracles=(timm==1.0.31 torch-lr-finder==0.2.2 tensorboard==2.21.0 scikit-learn==1.9.1 optuna==5.1.0
                safetensors==0.8.0 optuna-dashboard==0.21.0 mlflow==3.17.2 flask-wtf==1.3.0)

apt_packages=(build-essential cmake ninja-build ccache pkg-config
              libfmt-dev libspdlog-dev catch2 libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
              jq            # the tests check that jq reads the JSON files a run writes
              zlib1g-dev libpng-dev dataset-fashion-mnist python3-venv
              libcurl4-openssl-dev  # the MLflow client's HTTP
              libgloo-dev   # Gloo headers for c10d's ProcessGroupGloo.hpp (the wheel lacks them)
              fortunes      # apps/text_classification's default data: one class per fortune file
              iproute2      # `ip netns`: the two-machine launcher test (scripts/two_nodes.sh) runs here
              # scripts/test.sh compiles with clang (its precompiled header also holds LibTorch's template
              # instantiations: about half GCC's build time) and its OpenMP (libomp: the one source that
              # enters ATen's thread pool is compiled with OpenMP).
              clang libomp-14-dev)

# scripts/fuzz.sh and scripts/sanitize.sh also need clang's libFuzzer and sanitizer runtimes.
if [[ " $* " == *" --fuzz "* ]]; then
  apt_packages+=(libclang-rt-14-dev)
fi

if [ "$part" != oracles ]; then
missing=()
for p in "${apt_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: Debian packages present"
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating virtual environment $venv"
  # Debian's python3 has the venv module through python3-venv; any python3 >= 3.10 works.
  py=python3
  if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; fi
  "$py" -m venv "$venv"
fi

if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('torch').split('+')[0] != '$torch_version')" \
    2>/dev/null; then
  echo "setup: installing torch==$torch_version into $venv (a few GB, once)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q --no-compile "torch==$torch_version"  # byte-compiled below
else
  echo "setup: torch $torch_version present"
fi
fi  # the build's part
if [ "$part" = build ]; then
  echo "setup: done (the build's part)"
  exit 0
fi

# The oracles not yet at their pinned versions, installed by one pip call (one resolution).
missing_oracles=$("$venv/bin/python" - "${python_oracles[@]}" <<'PY'
import importlib.metadata as m, sys
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        have = m.version(name)
    except m.PackageNotFoundError:
        have = None
    if have != want:
        print(spec)
PY
)
if [ -n "$missing_oracles" ]; then
  echo "setup: installing" $missing_oracles
  # Naming the pinned torch beside the oracles keeps pip from replacing it.
  # shellcheck disable=SC2086  # one spec per word
  "$venv/bin/python" -m pip install -q --no-compile $missing_oracles "torch==$torch_version"
  installed=1
fi
# What was installed is byte-compiled once, on every core (pip compiles one file at a time; torch, installed
# by the build's part, has no byte-code yet): with PYTHONDONTWRITEBYTECODE set (as on CI machines) Python would
# otherwise compile every module it imports again in every test process (the Python tests of a fresh-clone run
# took ~2x as long). compileall exits 1 for the few files that are not Python 3 (some packages ship test data
# as .py); pip skips those too.
purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
if [ -n "${installed:-}" ] || [ ! -d "$purelib/torch/__pycache__" ]; then
  echo "setup: byte-compiling $purelib"
  "$venv/bin/python" -m compileall -q -j 0 "$purelib" > /dev/null || true
fi
# DeepSpeed compiles its CPU Adam op on first use (into the torch extensions cache) with the C++ compiler.
if [[ " $* " == *" --bench-peers "* ]] && ! "$venv/bin/python" -c "import deepspeed" 2>/dev/null; then
  echo "setup: installing deepspeed (bench_optim --deepspeed)"
  "$venv/bin/python" -m pip install -q deepspeed "torch==$torch_version"
fi
echo "setup: done"
