// The kernels' threading: work handed to detail/parallel.h's helpers really runs on ATen's intra-op threads.
// LibTorch's at::parallel_for runs on one thread in a translation unit compiled without OpenMP — this one
// is, like every test — so these tests fail if the helpers call it directly instead of parallel_range.
#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "detail/parallel.h"
#include "detail/parallel_range.h"

using trainkit::detail::Chunk;

namespace {

/// Restores ATen's intra-op thread count when a test ends.
struct ThreadCount {
  int before = at::get_num_threads();
  explicit ThreadCount(int n) { at::set_num_threads(n); }
  ~ThreadCount() { at::set_num_threads(before); }
};

/// The distinct ATen thread numbers seen by a callback, recorded under a lock.
struct Seen {
  std::mutex mu;
  std::set<int> threads;
  int64_t calls = 0;
  void record() {
    const std::lock_guard<std::mutex> lock(mu);
    threads.insert(at::get_thread_num());
    ++calls;
  }
};

}  // namespace

TEST_CASE("parallel_range runs one contiguous range on each of ATen's intra-op threads", "[threads]") {
  const ThreadCount two(2);
  Seen seen;
  std::vector<std::pair<int64_t, int64_t>> ranges(2, {-1, -1});
  trainkit::detail::parallel_range(0, 1000, 1, [&](int64_t b, int64_t e) {
    seen.record();
    ranges[static_cast<size_t>(at::get_thread_num())] = {b, e};
  });
  CHECK(seen.threads == std::set<int>{0, 1});
  CHECK(ranges[0] == std::pair<int64_t, int64_t>{0, 500});
  CHECK(ranges[1] == std::pair<int64_t, int64_t>{500, 1000});

  // Below the grain, inside a parallel region, or with one thread: one call with the whole range.
  Seen small;
  trainkit::detail::parallel_range(0, 10, 10, [&](int64_t b, int64_t e) {
    small.record();
    CHECK((b == 0 && e == 10));
  });
  CHECK(small.calls == 1);
  std::atomic<int64_t> nested_calls{0};
  trainkit::detail::parallel_range(0, 2, 1, [&](int64_t, int64_t) {
    trainkit::detail::parallel_range(0, 100, 1, [&](int64_t b, int64_t e) {
      CHECK((b == 0 && e == 100));
      ++nested_calls;
    });
  });
  CHECK(nested_calls.load() == 2);
}

TEST_CASE("the kernels' split, chunk and two-phase helpers use every intra-op thread", "[threads]") {
  const ThreadCount two(2);
  const std::vector<int64_t> numels{3 * trainkit::detail::kSplitMinPerThread, 17, trainkit::detail::kSplitMinPerThread};
  int64_t total = 0;
  for (const int64_t n : numels) {
    total += n;
  }
  Seen even;
  std::atomic<int64_t> covered{0};
  trainkit::detail::for_each_even(numels, [&](const Chunk& c) {
    even.record();
    covered += c.n;
  });
  CHECK(even.threads == std::set<int>{0, 1});
  CHECK(covered.load() == total);

  Seen chunks;
  trainkit::detail::for_each_chunk(trainkit::detail::make_chunks(numels), [&](const Chunk&) { chunks.record(); });
  CHECK(chunks.threads == std::set<int>{0, 1});

  Seen reduce, apply;
  std::vector<double> norms;
  trainkit::detail::two_phase_blocks<1>(
      numels,
      [&](const Chunk& c, std::array<double, 1>& partial) {
        reduce.record();
        partial[0] = static_cast<double>(c.n);
      },
      [&](size_t, const std::array<double, 1>& sums) { norms.push_back(sums[0]); },
      [&](const Chunk&) { apply.record(); });
  CHECK(reduce.threads == std::set<int>{0, 1});
  CHECK(apply.threads == std::set<int>{0, 1});
  CHECK(norms == std::vector<double>{static_cast<double>(numels[0]), 17.0, static_cast<double>(numels[2])});
}

TEST_CASE("an exception thrown on a worker thread reaches the caller", "[threads]") {
  const ThreadCount two(2);
  CHECK_THROWS_WITH(trainkit::detail::parallel_range(0, 1000, 1,
                                                     [&](int64_t b, int64_t) {
                                                       if (b > 0) {
                                                         throw std::runtime_error("from the second thread");
                                                       }
                                                     }),
                    "from the second thread");
}
