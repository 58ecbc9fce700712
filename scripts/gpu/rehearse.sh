#!/usr/bin/env bash
# Rehearses scripts/gpu/run.sh on this Debian machine as a GPU machine without Debian's development
# packages would run it, so that a lent GPU's minutes go to running, not fixing. In a private mount
# namespace, overlays hide what scripts/gpu/pack.sh carries (deps.sh names it): the development packages'
# headers, CMake and pkg-config files, development links and static libraries; the libraries of the carried
# closure that the build tools here do not load themselves; ccache. The virtual environment's python3, cmake
# and ninja come first on PATH (the GPU machine has PyTorch's wheel and pip's CMake and ninja). Anything the
# build takes from this machine instead of the carried folder then fails as it would there.
# Usage: scripts/gpu/rehearse.sh --venv DIR [run.sh arguments...]
#   --venv DIR   a virtual environment with torch (the GPU machine's version), cmake and ninja
# Needs root (unshare, overlay mounts) and gpu-deps/ from pack.sh. Nothing outside the namespace changes.

# shellcheck disable=SC2154  # gpu_dev_packages and gpu_library_closure come from deps.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=""
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
  exit 0
fi
if [ "${1:-}" = "--venv" ] && [ -n "${2:-}" ]; then venv=$(cd "$2" && pwd); shift 2; fi
if [ -z "$venv" ]; then echo "rehearse.sh: --venv DIR is required (see --help)" >&2; exit 2; fi
for tool in python cmake ninja; do
  if [ ! -x "$venv/bin/$tool" ]; then echo "rehearse.sh: $venv/bin/$tool not found (pip install torch cmake ninja)" >&2; exit 2; fi
done
if [ "$(id -u)" -ne 0 ]; then echo "rehearse.sh: needs root (unshare -m and overlay mounts)" >&2; exit 2; fi

if [ "${TRAINKIT_REHEARSAL_INSIDE:-}" != 1 ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  TRAINKIT_REHEARSAL_INSIDE=1 TRAINKIT_REHEARSAL_SCRATCH="$scratch" \
    unshare -m --propagation private bash "${BASH_SOURCE[0]}" --venv "$venv" "$@"
  exit $?
fi

# ---- inside the private mount namespace ----
# shellcheck source=scripts/gpu/deps.sh
. "$root/scripts/gpu/deps.sh"
scratch=$TRAINKIT_REHEARSAL_SCRATCH
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
libdir=/usr/lib/$multiarch

# What the build tools here load themselves stays (compiler, linker, assembler, nvcc's tools, Python's
# extension modules, pip's CMake and ninja, tar, git).
tools=("$(g++ -print-prog-name=cc1plus)" "$(command -v g++)" "$(command -v ld)" "$(command -v as)" "$(command -v tar)"
       "$(command -v git)" "$(readlink -f "$venv/bin/python")" "$(readlink -f "$venv/bin/cmake")")
cmake_real=$("$venv/bin/python" -c "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))" 2>/dev/null || true)
[ -n "$cmake_real" ] && tools+=("$cmake_real")
ninja_real=$("$venv/bin/python" -c "import ninja, os; print(os.path.join(ninja.BIN_DIR, 'ninja'))" 2>/dev/null || true)
[ -n "$ninja_real" ] && tools+=("$ninja_real")
for d in /usr/local/cuda/bin /usr/local/cuda/nvvm/bin; do
  [ -d "$d" ] && tools+=("$d"/*)
done
py_dynload=$("$venv/bin/python" -c "import _ctypes, os; print(os.path.dirname(_ctypes.__file__))")
tools+=("$py_dynload"/*.so)
declare -A keep=()
for t in "${tools[@]}"; do
  [ -f "$t" ] || continue
  while read -r dep; do keep[$(readlink -f "$dep")]=1; done < <(ldd "$t" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
done

mapfile -t closure < <(gpu_library_closure "$libdir")

# Overlays over the folders that hold what is hidden; deleting in an overlay leaves the disk as it is.
overlay() {
  local dir=$1 name
  name=$(echo "$dir" | tr / _)
  mkdir -p "$scratch/$name/upper" "$scratch/$name/work"
  mount -t overlay overlay -o "lowerdir=$dir,upperdir=$scratch/$name/upper,workdir=$scratch/$name/work" "$dir"
}
# /usr/lib before the folders inside it: an overlay's lower layer does not see the mounts below it.
for dir in /usr/lib /usr/include "$libdir" /usr/lib/cmake /usr/share/cmake /usr/share/pkgconfig /usr/bin; do
  overlay "$dir"
done

# The packages' files and links; then their folders that are left empty (a folder such as
# /usr/include/x86_64-linux-gnu that others share stays).
hidden=0
folders=()
for p in "${gpu_dev_packages[@]}"; do
  while IFS= read -r f; do
    case "$f" in
      /usr/include/*|"$libdir"/cmake/*|/usr/lib/cmake/*|/usr/share/cmake/*|"$libdir"/lib*.so|/usr/lib/lib*.so|\
      "$libdir"/lib*.a|/usr/lib/lib*.a|"$libdir"/pkgconfig/*|/usr/share/pkgconfig/*)
        if [ -d "$f" ] && [ ! -L "$f" ]; then
          folders+=("$f")
        elif [ -e "$f" ] || [ -L "$f" ]; then
          rm -f "$f"
          hidden=$((hidden + 1))
        fi ;;
    esac
  done < <(dpkg -L "$p")
done
while read -r d; do rmdir "$d" 2> /dev/null || true; done < <(printf '%s\n' "${folders[@]}" | sort -r)
hidden_libs=()
kept_libs=()
for real in "${closure[@]}"; do
  name=$(basename "$real")
  if [ -n "${keep[$real]:-}" ]; then
    kept_libs+=("$name")
    continue
  fi
  # the file and its soname link (libcurl.so.4.8.0 and libcurl.so.4)
  rm -f "$libdir/${name%%.so*}.so".*
  hidden_libs+=("$name")
done
rm -f /usr/bin/ccache
echo "rehearse.sh: hidden: $hidden files of ${gpu_dev_packages[*]}; ccache; the libraries ${hidden_libs[*]}"
echo "rehearse.sh: left in place because the build tools load them: ${kept_libs[*]:-none}"

export PATH="$venv/bin:$PATH" TRAINKIT_PYTHON="$venv/bin/python"
exec bash "$root/scripts/gpu/run.sh" "$@"
