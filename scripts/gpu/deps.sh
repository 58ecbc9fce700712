# shellcheck shell=bash disable=SC2034
# Sourced by scripts/gpu/pack.sh and scripts/gpu/rehearse.sh: what a GPU machine without Debian's
# development packages lacks, named once.
# The development packages whose headers and CMake package files the build needs (scripts/setup.sh
# installs them here).
gpu_dev_packages=(libfmt-dev libspdlog-dev catch2 libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libgloo-dev
                  libcurl4-openssl-dev zlib1g-dev libpng-dev)
# The shared libraries the programs link (by their unversioned development link); their dependency
# closure is carried with them.
gpu_library_links=(libfmt.so libspdlog.so libcurl.so libpng16.so libz.so)

# gpu_library_closure LIBDIR: the real files of gpu_library_links and of everything they load, one a line,
# without what every Linux with a C++ compiler has (glibc, libstdc++, libgcc_s).
gpu_library_closure() {
  local libdir=$1 lib dep
  local -A seen=()
  local queue=()
  for lib in "${gpu_library_links[@]}"; do queue+=("$(readlink -f "$libdir/$lib")"); done
  while ((${#queue[@]})); do
    lib=${queue[0]}
    queue=("${queue[@]:1}")
    [ -n "${seen[$lib]:-}" ] && continue
    seen[$lib]=1
    echo "$lib"
    while read -r dep; do
      case "$(basename "$dep")" in
        libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|libutil.so.*|ld-linux*|\
        libstdc++.so.*|libgcc_s.so.*) continue ;;
      esac
      queue+=("$(readlink -f "$dep")")
    done < <(ldd "$lib" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
  done
}
