#pragma once
// The multithreaded chunk machinery shared by the fused optimizers (optim), gradient clipping (grad) and
// the GradScaler overflow check (amp): which tensors the CPU kernels can take, the threaded loop over
// chunks, and the reductions whose results do not depend on the thread count.

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include "detail/kernels.h"
#include "detail/parallel_range.h"

namespace trainkit::detail {

/// Whether the fused CPU kernels can take all these tensors: contiguous, CPU, float32 or float64, one dtype.
/// When not, `why` (if given) says which condition failed.
inline bool fusable(const std::vector<at::Tensor>& tensors, std::string* why) {
  if (tensors.empty()) {
    return true;
  }
  const auto dtype = tensors.front().scalar_type();
  for (const auto& t : tensors) {
    std::string reason;
    if (!t.device().is_cpu()) {
      reason = fmt::format("a tensor is on {}", t.device().str());
    } else if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble) {
      reason = fmt::format("a tensor has dtype {}", c10::toString(t.scalar_type()));
    } else if (t.scalar_type() != dtype) {
      reason = "the tensors mix float32 and float64";
    } else if (!t.is_contiguous()) {
      reason = "a tensor is not contiguous";
    }
    if (!reason.empty()) {
      if (why != nullptr) {
        *why = reason;
      }
      return false;
    }
  }
  return true;
}

/// The numel of each tensor.
inline std::vector<int64_t> numels_of(const std::vector<at::Tensor>& tensors) {
  std::vector<int64_t> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    out.push_back(t.numel());
  }
  return out;
}

/// The value of a 0-dim tensor (or `if_undefined` when undefined). Reading a CPU scalar is no device sync.
inline double cpu_scalar(const at::Tensor& t, double if_undefined) {
  if (!t.defined()) {
    return if_undefined;
  }
  return t.device().is_cpu() ? t.item<double>() : t.to(at::kCPU).item<double>();
}

/// Calls fn(chunk) for every chunk, spread over ATen's intra-op threads (through parallel_range: a plain
/// at::parallel_for here would run serially in every translation unit compiled without OpenMP).
template <class Fn>
void for_each_chunk(const std::vector<Chunk>& chunks, const Fn& fn) {
  parallel_range(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      fn(chunks[static_cast<size_t>(c)]);
    }
  });
}

/// Calls fn(chunk) for every chunk of even_split(numels, threads): each of ATen's intra-op threads gets one
/// contiguous range of the group's elements (crossing tensor boundaries, boundaries on cache lines) of the
/// same size, so that no thread waits for another at the end; a group of fewer than kSplitMinPerThread
/// elements per thread runs on fewer threads. For element-wise kernels only: which thread updates an element
/// never changes its value.
template <class Fn>
void for_each_even(const std::vector<int64_t>& numels, const Fn& fn) {
  const SplitMode mode = split_mode();
  if (mode == SplitMode::kChunks) {
    for_each_chunk(make_chunks(numels), fn);
    return;
  }
  int64_t total = 0;
  for (const int64_t n : numels) {
    total += n;
  }
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const int64_t parts = std::clamp<int64_t>(total / kSplitMinPerThread, 1, std::max<int64_t>(threads, 1));
  const auto split = mode == SplitMode::kContiguous ? even_split(numels, parts) : per_tensor_split(numels, parts);
  const auto run = [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      for (const Chunk& c : split[static_cast<size_t>(k)]) {
        fn(c);
      }
    }
  };
  if (parts == 1) {
    run(0, 1);
  } else {
    parallel_range(0, parts, 1, run);
  }
}

/// K partial results per chunk: reduce(chunk, partial) fills `partial` (zero-initialized) for every chunk,
/// in parallel. Combining the partials in chunk order makes a result independent of the thread count.
template <std::size_t K, class Reduce>
std::vector<std::array<double, K>> reduce_chunks(const std::vector<Chunk>& chunks, const Reduce& reduce) {
  std::vector<std::array<double, K>> partial(chunks.size(), std::array<double, K>{});
  for_each_chunk(chunks, [&](const Chunk& c) { reduce(c, partial[static_cast<size_t>(&c - chunks.data())]); });
  return partial;
}

/// The two-phase pass of the layer-wise optimizers (LARS, LAMB): a tensor's norms must be complete before
/// it is updated, so the tensors go block by block (make_blocks), and in each block
///   1. reduce(chunk, partial) fills K sums per chunk, in parallel (e.g. Σp², Σg²);
///   2. they are added per tensor in chunk order (independent of the thread count), and
///      between(t, sums) runs once per tensor t of the block (e.g. the trust ratio);
///   3. apply(chunk) updates every chunk of the block, in parallel, while the block is still in cache
///      (each thread in reverse order of step 1, starting with its most recently read chunk).
template <std::size_t K, class Reduce, class Between, class Apply>
void two_phase_blocks(const std::vector<int64_t>& numels, const Reduce& reduce, const Between& between,
                      const Apply& apply) {
  for (const auto& [first, last] : make_blocks(numels)) {
    const auto chunks = make_chunks(numels, first, last);
    const auto partial = reduce_chunks<K>(chunks, reduce);
    std::vector<std::array<double, K>> sums(last - first, std::array<double, K>{});
    for (size_t c = 0; c < chunks.size(); ++c) {
      auto& s = sums[static_cast<size_t>(chunks[c].tensor) - first];
      for (std::size_t k = 0; k < K; ++k) {
        s[k] += partial[c][k];
      }
    }
    for (size_t t = first; t < last; ++t) {
      between(t, sums[t - first]);
    }
    // Each thread gets the same chunks as in step 1 (same range, same split) and walks them backwards, so
    // that it starts with what it read last: what is still in cache when a block exceeds the cache.
    parallel_range(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = end - 1; c >= begin; --c) {
        apply(chunks[static_cast<size_t>(c)]);
      }
    });
  }
}

/// The total p-norm of `grads` as a 0-dim tensor of their dtype on the first one's device (0 when empty),
/// as torch.nn.utils.get_total_norm computes it: on the fused path one threaded pass over chunks combined in
/// chunk order; otherwise ATen's foreach norms per (device, dtype), then the norm of the norms.
at::Tensor total_norm(const std::vector<at::Tensor>& grads, double p);

}  // namespace trainkit::detail
