#pragma once
/// @file
/// A caching allocator for LibTorch's CPU tensors. Training allocates the same large activation buffers
/// every step; freed, each goes back to the C library, which hands large blocks to the kernel, so the next
/// step page-faults every page in again (zeroed) — on a 2-core VM ~16% of a small CNN's step. The cache keeps
/// freed large blocks by size class for the next allocation of that class, as CUDA's caching allocator does
/// for device memory (measured in docs/training.md#host-memory).
///
///     trainkit::train::enable_host_caching_allocator();  // once, before training
///     ... train ...
///     trainkit::train::empty_host_cache();               // optional: give idle blocks back

#include <cstdint>

namespace trainkit::train {

/// Blocks of at least this many bytes are cached; smaller ones go straight to the C library, whose bins
/// already reuse them.
inline constexpr int64_t kHostCacheMinBlock = int64_t{1} << 20;

/// Idle bytes the cache holds at most by default (2 GiB); a block freed beyond it goes back to the system.
inline constexpr int64_t kHostCacheDefaultLimit = int64_t{2} << 30;

/// Makes the caching allocator LibTorch's CPU allocator (c10::SetCPUAllocator) and sets how many idle bytes
/// it may hold (`max_cached_bytes`, >= 0). Blocks of kHostCacheMinBlock bytes or more are rounded up to a
/// size class (an eighth of a power of two: at most 12.5% more address space; untouched pages cost no
/// memory) and, freed, kept for the next allocation of that class. Process-wide; tensors allocated before
/// keep their allocator. A second call only changes the limit. Returns false, installing nothing, when
/// another allocator holds a higher priority than LibTorch's default.
bool enable_host_caching_allocator(int64_t max_cached_bytes = kHostCacheDefaultLimit);

/// Frees every idle cached block (as torch.cuda.empty_cache()); blocks in use stay.
void empty_host_cache();

/// The cache's counters since it was enabled (all 0 before).
struct HostCacheStats {
  int64_t in_use_bytes = 0;     ///< size classes of the cached-size blocks now in tensors
  int64_t cached_bytes = 0;     ///< size classes of the idle blocks held for reuse
  int64_t allocations = 0;      ///< cached-size blocks handed out
  int64_t hits = 0;             ///< of them, served from the cache
  int64_t released_bytes = 0;   ///< bytes given back to the system (over the limit or emptied)
};

/// The cache's counters (HostCacheStats).
HostCacheStats host_cache_stats();

}  // namespace trainkit::train
