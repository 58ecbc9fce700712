// A probe for scripts/check_parallel_for.sh's self-test (compiled, never linked): a direct, qualified
// at::parallel_for call, which is serial in a source compiled without OpenMP. The check must flag it.
#include <ATen/Parallel.h>

void trainkit_probe_qualified(float* x, int64_t n) {
  at::parallel_for(0, n, 1, [x](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      x[i] += 1.0f;
    }
  });
}
