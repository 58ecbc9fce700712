# The sanitizers' run-time options, sourced by scripts/sanitize.sh and scripts/fuzz.sh.
# protect_shadow_gap=0: LibTorch's CUDA libraries map memory where ASan's shadow gap would be.
sanitize_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ASAN_OPTIONS="protect_shadow_gap=0:detect_leaks=1:abort_on_error=0:halt_on_error=1:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$sanitize_dir/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
