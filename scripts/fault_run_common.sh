# Sourced by scripts/kill_anywhere.sh and scripts/full_disk.sh: the check of --cli and the writer of their
# small training configs.

# require_cli SCRIPT_NAME CLI: exits 2 unless CLI is an executable.
require_cli() {
  if [ -z "$2" ] || [ ! -x "$2" ]; then
    echo "$1: --cli must name the trainkit executable (got '$2')" >&2
    exit 2
  fi
}

# write_config FILE DATA_DIR: a [data] section (with `dir` when DATA_DIR is set) whose keys continue with
# the TOML read from stdin.
write_config() {
  {
    echo "[data]"
    if [ -n "$2" ]; then echo "dir = \"$2\""; fi
    cat
  } >"$1"
}
