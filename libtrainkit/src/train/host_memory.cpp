#include "trainkit/train/host_memory.h"

#include <mutex>
#include <unordered_map>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include "detail/check.h"

namespace trainkit::train {
namespace {

// Each block starts with a header holding its size class (0: not cached), so that freeing a small block
// takes no lock and no lookup. 64 bytes keep the tensor's data at alloc_cpu's 64-byte alignment.
constexpr size_t kHeader = 64;

/// Rounds `bytes` up to its size class: a multiple of an eighth of the largest power of two <= bytes.
size_t size_class(size_t bytes) {
  size_t power = 1;
  while (power <= bytes / 2) {
    power *= 2;
  }
  const size_t step = power / 8;
  return (bytes + step - 1) / step * step;
}

class CachingHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* data = n == 0 ? nullptr : acquire(n);
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void set_limit(int64_t bytes) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      limit_ = bytes;
    }
    shrink_to(bytes);
  }

  /// Frees idle blocks, largest classes first, until at most `keep` idle bytes remain (the lock is not held
  /// while the C library frees them).
  void shrink_to(int64_t keep) {
    std::vector<void*> drop;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      while (stats_.cached_bytes > keep) {
        auto largest = idle_.end();
        for (auto it = idle_.begin(); it != idle_.end(); ++it) {
          if (!it->second.empty() && (largest == idle_.end() || it->first > largest->first)) {
            largest = it;
          }
        }
        drop.push_back(largest->second.back());
        largest->second.pop_back();
        stats_.cached_bytes -= static_cast<int64_t>(largest->first);
        stats_.released_bytes += static_cast<int64_t>(largest->first);
      }
    }
    for (void* base : drop) {
      c10::free_cpu(base);
    }
  }

  HostCacheStats stats() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  static size_t* header(void* data) { return reinterpret_cast<size_t*>(static_cast<char*>(data) - kHeader); }

  void* acquire(size_t n) {
    TRAINKIT_CHECK_ARG(n <= SIZE_MAX / 2, "host caching allocator: {} bytes requested", n);
    const size_t cls = n >= static_cast<size_t>(kHostCacheMinBlock) ? size_class(n) : 0;
    if (cls != 0) {
      const std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.allocations;
      auto it = idle_.find(cls);
      if (it != idle_.end() && !it->second.empty()) {
        void* base = it->second.back();
        it->second.pop_back();
        ++stats_.hits;
        stats_.cached_bytes -= static_cast<int64_t>(cls);
        stats_.in_use_bytes += static_cast<int64_t>(cls);
        return static_cast<char*>(base) + kHeader;
      }
      stats_.in_use_bytes += static_cast<int64_t>(cls);
    }
    const size_t bytes = (cls != 0 ? cls : n) + kHeader;
    void* base = nullptr;
    try {
      base = c10::alloc_cpu(bytes);
    } catch (const c10::Error&) {
      // Out of memory: give the idle blocks back and try once more.
      shrink_to(0);
      try {
        base = c10::alloc_cpu(bytes);
      } catch (...) {
        if (cls != 0) {
          const std::lock_guard<std::mutex> lock(mutex_);
          stats_.in_use_bytes -= static_cast<int64_t>(cls);
        }
        throw;
      }
    }
    *static_cast<size_t*>(base) = cls;
    return static_cast<char*>(base) + kHeader;
  }

  static void release(void* data);

  void give_back(void* data) {
    void* base = static_cast<char*>(data) - kHeader;
    const size_t cls = *header(data);
    if (cls == 0) {
      c10::free_cpu(base);
      return;
    }
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stats_.in_use_bytes -= static_cast<int64_t>(cls);
      if (stats_.cached_bytes + static_cast<int64_t>(cls) <= limit_) {
        idle_[cls].push_back(base);
        stats_.cached_bytes += static_cast<int64_t>(cls);
        return;
      }
      stats_.released_bytes += static_cast<int64_t>(cls);
    }
    c10::free_cpu(base);
  }

  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> idle_;  // size class -> idle blocks (their bases)
  int64_t limit_ = kHostCacheDefaultLimit;
  HostCacheStats stats_;
};

// Never destroyed: tensors freed while the process exits (static destructors, other threads) still find it.
CachingHostAllocator* instance() {
  static auto* allocator = new CachingHostAllocator();
  return allocator;
}

void CachingHostAllocator::release(void* data) {
  if (data != nullptr) {
    instance()->give_back(data);
  }
}

std::once_flag g_installed;
bool g_active = false;

}  // namespace

bool enable_host_caching_allocator(int64_t max_cached_bytes) {
  TRAINKIT_CHECK_ARG(max_cached_bytes >= 0, "enable_host_caching_allocator: invalid max_cached_bytes: {}",
                     max_cached_bytes);
  instance()->set_limit(max_cached_bytes);
  std::call_once(g_installed, [] {
    // Priority 1: above LibTorch's own default (0), below an allocator a program installed on purpose.
    c10::SetCPUAllocator(instance(), /*priority=*/1);
    g_active = c10::GetCPUAllocator() == instance();
  });
  return g_active;
}

void empty_host_cache() { instance()->shrink_to(0); }

HostCacheStats host_cache_stats() { return instance()->stats(); }

}  // namespace trainkit::train
