// Compiled with OpenMP (see libtrainkit/CMakeLists.txt), so that at::parallel_for below takes its parallel
// path; the reason is in parallel_range.h. Skips the precompiled header, which is built without OpenMP.
#include "detail/parallel_range.h"

#include <ATen/Config.h>
#include <ATen/Parallel.h>

#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "detail/parallel_range.cpp must be compiled with OpenMP, or at::parallel_for runs on one thread"
#endif

namespace trainkit::detail {

void parallel_range_impl(int64_t begin, int64_t end, int64_t grain, RangeFn fn, const void* context) {
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { fn(context, b, e); });
}

}  // namespace trainkit::detail
