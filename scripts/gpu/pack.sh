#!/usr/bin/env bash
# Packs what a GPU machine without Debian's development packages needs to build and run trainkit
# (scripts/gpu/run.sh there) into one git-ignored folder that travels with the working tree.
# Usage: scripts/gpu/pack.sh [--out DIR] [--data-dir DIR] [--limit-mib N]
#   --out DIR       the folder to fill (default: gpu-deps/ in the repository root; it is emptied first)
#   --data-dir DIR  Fashion-MNIST's four gzip'd IDX files (default: Debian's dataset-fashion-mnist)
#   --limit-mib N   fail when the repository's tracked files plus the folder exceed N MiB (default 64)
# Runs on the Debian development machine after scripts/setup.sh. The folder holds:
#   deps.tar.gz   a usr/ tree: the headers and CMake package files of fmt, spdlog, Catch2 2, CLI11, toml++,
#                 nlohmann-json, Gloo (headers only), libcurl, zlib and libpng, and the shared libraries the
#                 programs link that the target may lack (fmt, spdlog, libcurl with its dependency closure,
#                 libpng, zlib), without glibc, libstdc++ and libgcc_s, which every target has.
#   fashion-mnist/ the data set of the benchmarks and the main job.
#   MANIFEST.txt  the packages and versions inside, the commit packed from, the sizes.
# Debian's compiled fmt and spdlog are carried as they are (the headers they were built with plus their .so)
# rather than switched to header-only builds: the GPU build then compiles exactly what CI compiles here.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out="$root/gpu-deps"
data_dir=/usr/share/datasets/fashion-mnist
limit_mib=64

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --data-dir) data_dir=$2; shift 2 ;;
    --limit-mib) limit_mib=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "pack.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# shellcheck source=scripts/gpu/deps.sh
. "$root/scripts/gpu/deps.sh"
dev_packages=("${gpu_dev_packages[@]}")
missing=()
for p in "${dev_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then missing+=("$p"); fi
done
if ((${#missing[@]})); then
  echo "pack.sh: missing Debian packages: ${missing[*]} (scripts/setup.sh installs them)" >&2
  exit 1
fi
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  if [ ! -f "$data_dir/$f" ]; then
    echo "pack.sh: $data_dir/$f not found (Debian: dataset-fashion-mnist; or --data-dir)" >&2
    exit 1
  fi
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
libdir=/usr/lib/$multiarch

# Copies an absolute path (file or symbolic link, as it is) into the staged usr/ tree.
stage_path() {
  local src=$1
  local dst="$stage/${src#/}"
  mkdir -p "$(dirname "$dst")"
  cp -a "$src" "$dst"
}

# Headers, CMake package files and the unversioned .so links of the development packages. Gloo contributes
# its headers only (c10d's ProcessGroupGloo.hpp includes them; the wheel's libtorch has Gloo compiled in).
for p in "${dev_packages[@]}"; do
  while IFS= read -r f; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    [ -d "$f" ] && [ ! -L "$f" ] && continue
    case "$f" in
      # trainkit uses toml++ header-only and Gloo's headers alone: their libraries and CMake files stay.
      "$libdir"/libtomlplusplus.so*|"$libdir"/cmake/tomlplusplus/*|/usr/share/cmake/Gloo/*) ;;
      /usr/include/*|"$libdir"/cmake/*|/usr/lib/cmake/*|/usr/share/cmake/*) stage_path "$f" ;;
      "$libdir"/lib*.so) stage_path "$f" ;;
    esac
  done < <(dpkg -L "$p")
done

# The static libraries that a carried CMake package file names (Catch2's libCatch2WithMain.a).
for a in $(grep -rhoE 'lib[A-Za-z0-9_+-]+\.a' "$stage" --include='*.cmake' | sort -u); do
  for d in /usr/lib "$libdir"; do
    if [ -f "$d/$a" ]; then stage_path "$d/$a"; fi
  done
done

# The shared libraries and their dependency closure (each with its soname link), minus what every Linux with a
# C++ compiler has.
mkdir -p "$stage$libdir"
while read -r real; do
  cp -L "$real" "$stage$libdir/$(basename "$real")"
  soname=$(objdump -p "$real" | awk '$1 == "SONAME" {print $2}')
  if [ -n "$soname" ] && [ "$soname" != "$(basename "$real")" ]; then
    ln -sf "$(basename "$real")" "$stage$libdir/$soname"
  fi
done < <(gpu_library_closure "$libdir")

rm -rf "$out"
mkdir -p "$out/fashion-mnist"
tar -C "$stage" -czf "$out/deps.tar.gz" usr
cp "$data_dir"/*-ubyte.gz "$out/fashion-mnist/"

tracked=$(cd "$root" && git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
packed=$(du -sb "$out" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
{
  echo "# trainkit GPU dependencies, packed by scripts/gpu/pack.sh"
  echo "commit: $(cd "$root" && git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "packed: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "packages:"
  for p in "${dev_packages[@]}"; do echo "  $p $(dpkg-query -W -f='${Version}' "$p")"; done
  echo "libraries:"
  tar -tzf "$out/deps.tar.gz" | grep -E '\.so\.[0-9]' | sed 's|.*/|  |' | sort
  echo "deps.tar.gz: $(mib "$(stat -c %s "$out/deps.tar.gz")") MiB (unpacked $(mib "$(du -sb "$stage" | cut -f1)") MiB)"
  echo "fashion-mnist: $(mib "$(du -sb "$out/fashion-mnist" | cut -f1)") MiB"
} > "$out/MANIFEST.txt"

total=$((tracked + packed))
echo "pack.sh: $out: $(mib "$packed") MiB (deps.tar.gz $(mib "$(stat -c %s "$out/deps.tar.gz")") MiB," \
     "fashion-mnist $(mib "$(du -sb "$out/fashion-mnist" | cut -f1)") MiB); tracked files $(mib "$tracked") MiB;" \
     "together $(mib "$total") MiB of at most $limit_mib"
if ((total > limit_mib * 1048576)); then
  echo "pack.sh: the working tree and the folder exceed $limit_mib MiB" >&2
  exit 1
fi
