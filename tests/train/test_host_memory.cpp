// The host caching allocator: a large block freed and allocated again comes back from the cache, without the
// page faults of a fresh block (the C library unmaps blocks this large when freed, so every training step
// faulted its activations in anew); size classes, the idle limit, empty_host_cache, small blocks left to the
// C library, and LibTorch's raw allocate/deallocate through the installed allocator.
#include <sys/resource.h>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include "support.h"
#include "trainkit/train/host_memory.h"

using trainkit::train::host_cache_stats;

namespace {

constexpr int64_t kBlockFloats = int64_t{16} << 20;  // 64 MiB
constexpr int64_t kBlockBytes = kBlockFloats * 4;

int64_t minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

/// Minor page faults of allocating, writing and freeing a 64 MiB tensor `cycles` times.
int64_t faults_of_cycles(int cycles) {
  const int64_t before = minor_faults();
  for (int i = 0; i < cycles; ++i) {
    torch::Tensor t = torch::empty({kBlockFloats});
    t.fill_(static_cast<float>(i));
    REQUIRE(t[kBlockFloats - 1].item<float>() == static_cast<float>(i));
  }
  return minor_faults() - before;
}

}  // namespace

TEST_CASE("the host cache serves a freed 64 MiB block again without page faults", "[host_memory]") {
  constexpr int kCycles = 8;
  constexpr int64_t kPages = kBlockBytes / 4096;
  faults_of_cycles(1);
  const int64_t by_default = faults_of_cycles(kCycles);
  REQUIRE(trainkit::train::enable_host_caching_allocator());
  faults_of_cycles(1);  // the first block of the class
  const auto before = host_cache_stats();
  const int64_t cached = faults_of_cycles(kCycles);
  const auto after = host_cache_stats();
  INFO("minor page faults over " << kCycles << " cycles: " << by_default << " with LibTorch's allocator, " << cached
                                 << " cached (" << kPages << " 4 KiB pages per block)");
  CHECK(after.allocations - before.allocations == kCycles);
  CHECK(after.hits - before.hits == kCycles);
  // A reused block faults no page in; a fresh one faults each of its pages (fewer where the kernel backs it
  // with huge pages, hence no bound on the default's count).
  CHECK(cached < kPages / 16);
}

TEST_CASE("the host cache rounds blocks to size classes and leaves small ones to the C library", "[host_memory]") {
  REQUIRE(trainkit::train::enable_host_caching_allocator());
  const auto base = host_cache_stats();
  {
    // A fast.toml activation: 256 x 32 x 28 x 28 floats = 25 690 112 bytes; its class is the next multiple of
    // 2 MiB (an eighth of 16 MiB): 26 MiB.
    torch::Tensor t = torch::empty({256, 32, 28, 28});
    CHECK(host_cache_stats().in_use_bytes - base.in_use_bytes == 26 << 20);
    torch::Tensor small = torch::empty({1000});
    CHECK(host_cache_stats().allocations - base.allocations == 1);
  }
  const auto freed = host_cache_stats();
  CHECK(freed.in_use_bytes == base.in_use_bytes);
  CHECK(freed.cached_bytes >= 26 << 20);
  {
    // 25 MiB + 1 byte: the same class, so the idle 26 MiB block serves it.
    torch::Tensor t = torch::empty({(int64_t{25} << 20) + 1}, torch::kUInt8);
    CHECK(host_cache_stats().hits - freed.hits == 1);
  }
}

TEST_CASE("the host cache keeps idle bytes under its limit and empties on request", "[host_memory]") {
  REQUIRE(trainkit::train::enable_host_caching_allocator());
  trainkit::train::empty_host_cache();
  CHECK(host_cache_stats().cached_bytes == 0);
  {
    std::vector<torch::Tensor> held;
    for (int i = 0; i < 3; ++i) {
      held.push_back(torch::ones({kBlockFloats}));
    }
  }
  CHECK(host_cache_stats().cached_bytes == 3 * kBlockBytes);
  const int64_t released = host_cache_stats().released_bytes;
  // Lowering the limit gives back what is over it at once; blocks freed later beyond it are not kept.
  REQUIRE(trainkit::train::enable_host_caching_allocator(kBlockBytes));
  CHECK(host_cache_stats().cached_bytes == kBlockBytes);
  CHECK(host_cache_stats().released_bytes - released == 2 * kBlockBytes);
  {
    torch::Tensor a = torch::ones({kBlockFloats});  // from the cache
    torch::Tensor b = torch::ones({kBlockFloats});  // new
    CHECK(host_cache_stats().cached_bytes == 0);
  }
  CHECK(host_cache_stats().cached_bytes == kBlockBytes);
  CHECK(host_cache_stats().released_bytes - released == 3 * kBlockBytes);
  trainkit::train::empty_host_cache();
  CHECK(host_cache_stats().cached_bytes == 0);
  REQUIRE(trainkit::train::enable_host_caching_allocator());
  CHECK_THROWS_WITH(trainkit::train::enable_host_caching_allocator(-1), Catch::Contains("max_cached_bytes: -1"));
}

TEST_CASE("LibTorch's raw allocate and deallocate work through the host cache", "[host_memory]") {
  REQUIRE(trainkit::train::enable_host_caching_allocator());
  c10::Allocator* allocator = c10::GetCPUAllocator();
  REQUIRE(allocator->raw_deleter() != nullptr);
  for (const size_t bytes : {size_t{100}, size_t{3} << 20}) {
    void* p = allocator->raw_allocate(bytes);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
    std::memset(p, 7, bytes);
    allocator->raw_deallocate(p);
  }
  // Tensors from before and after the switch mix freely.
  torch::Tensor x = torch::arange(1 << 20, torch::kFloat);
  CHECK((x + x).sum().item<double>() == Approx(double(1 << 20) * ((1 << 20) - 1)));
}
