#pragma once
// The one door into ATen's intra-op thread pool for all of trainkit's kernels.
//
// LibTorch's at::parallel_for is an inline template whose parallel path exists only where _OPENMP is defined
// (ATen/ParallelOpenMP.h; the PyPI wheels are OpenMP builds): in a translation unit compiled without OpenMP
// it calls f(begin, end) once, on the calling thread, without a word. Kernels that called it directly from
// such a translation unit would run serially. parallel_range's source is compiled with OpenMP (and the
// library links the same libgomp that LibTorch loads), so templates in any translation unit — the library's,
// a test's, a benchmark's — run in parallel through it. Includes no LibTorch header.
#include <cstdint>

namespace trainkit::detail {

using RangeFn = void (*)(const void* context, int64_t begin, int64_t end);

/// at::parallel_for(begin, end, grain, ...) compiled with OpenMP: fn(context, b, e) for one contiguous range
/// per intra-op thread. Serial (one call with the whole range) inside a parallel region, with one thread, or
/// when end − begin ≤ grain. An exception thrown by fn is rethrown to the caller.
void parallel_range_impl(int64_t begin, int64_t end, int64_t grain, RangeFn fn, const void* context);

/// parallel_range(begin, end, grain, fn) calls fn(b, e) as parallel_range_impl does.
template <class Fn>
void parallel_range(int64_t begin, int64_t end, int64_t grain, const Fn& fn) {
  parallel_range_impl(
      begin, end, grain, [](const void* f, int64_t b, int64_t e) { (*static_cast<const Fn*>(f))(b, e); }, &fn);
}

}  // namespace trainkit::detail
