// A probe for scripts/check_parallel_for.sh's self-test (compiled, never linked): parallel_reduce called
// without its namespace after `using namespace at;`, which a text search for "at::parallel_" misses. The
// check must flag it.
#include <functional>

#include <ATen/Parallel.h>

using namespace at;

float trainkit_probe_unqualified(const float* x, int64_t n) {
  return parallel_reduce(0, n, 1, 0.0f, [x](int64_t begin, int64_t end, float sum) {
    for (int64_t i = begin; i < end; ++i) {
      sum += x[i];
    }
    return sum;
  }, std::plus<float>());
}
