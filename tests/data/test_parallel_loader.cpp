// ParallelLoader: the batches (order and seeded augmentation) do not depend on num_workers and equal
// TensorLoader's order for the same options; resume, cancellation, errors, early stop and the bounded
// prefetch window; worker threads run with one intra-op thread and leave the caller's setting alone.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "data/read_batches.h"
#include "support.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/parallel_loader.h"
#include "trainkit/data/tensor_loader.h"

using trainkit::data::Batch;
using trainkit::data::ParallelLoader;
using trainkit::data::ParallelLoaderOptions;
using trainkit::test::read_epoch;
using trainkit::test::read_rest;
using trainkit::test::WhatContains;

namespace {

// Sample i: input i (int64 scalar), target 0: three uniform draws from the sample's generator.
Batch index_sample(int64_t i, at::Generator& gen) {
  return Batch(torch::tensor(i, torch::kInt64), torch::rand({3}, gen, torch::TensorOptions().dtype(torch::kFloat)));
}


void check_same(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("batch " << i);
    CHECK(torch::equal(a[i].input(), b[i].input()));
    CHECK(torch::equal(a[i].target(), b[i].target()));
  }
}

// Waits until `counter` reaches `value`. Workers load samples in microseconds; the deadline only turns a hang
// into a failure. What is loaded beyond `value` is counted after the loader is destroyed (its workers joined),
// never after a wait.
void wait_until(const std::atomic<int64_t>& counter, int64_t value) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (counter.load() < value && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
  }
}

// Holds the samples that enter it until opened, counting them.
class Gate {
 public:
  void pass() {
    std::unique_lock<std::mutex> lock(mutex_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void wait_for(int64_t waiting) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return waiting_ >= waiting; });
  }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t waiting_ = 0;
  bool open_ = false;
};

}  // namespace

TEST_CASE("ParallelLoader yields the batches of 0 workers and TensorLoader's order", "[data][parallel]") {
  const int64_t n = 103;
  const at::Tensor all = torch::arange(n, torch::kInt64);
  struct Case {
    const char* name;
    ParallelLoaderOptions options;
  };
  const std::vector<Case> cases = {
      {"shuffled", ParallelLoaderOptions().batch_size(10).seed(7)},
      {"sequential, drop_last", ParallelLoaderOptions().batch_size(10).shuffle(false).drop_last(true)},
      {"rank 1 of 3", ParallelLoaderOptions().batch_size(8).seed(3).num_replicas(3).rank(1)},
      {"rank 2 of 4, no shuffle", ParallelLoaderOptions().batch_size(6).shuffle(false).num_replicas(4).rank(2)},
      {"rank 2 of 3, uneven shards", ParallelLoaderOptions().batch_size(7).seed(1).num_replicas(3).rank(2).even_shards(false)},
  };
  for (const auto& c : cases) {
    SECTION(c.name) {
      const auto& o = c.options;
      trainkit::data::TensorLoader reference(all, all,
                                             trainkit::data::TensorLoaderOptions()
                                                 .batch_size(o.batch_size())
                                                 .shuffle(o.shuffle())
                                                 .drop_last(o.drop_last())
                                                 .seed(o.seed())
                                                 .num_replicas(o.num_replicas())
                                                 .rank(o.rank())
                                                 .even_shards(o.even_shards()));
      ParallelLoader serial(n, index_sample, o);
      REQUIRE(serial.num_batches() == reference.num_batches());
      for (const int64_t epoch : {0, 2}) {
        const auto expected = read_epoch(serial, epoch);
        const auto order = read_epoch(reference, epoch);
        REQUIRE(expected.size() == order.size());
        for (size_t b = 0; b < order.size(); ++b) {
          CHECK(torch::equal(expected[b].input(), order[b].input()));
        }
        for (const int64_t workers : {1, 2, 4}) {
          INFO("epoch " << epoch << ", " << workers << " workers");
          ParallelLoader parallel(n, index_sample, ParallelLoaderOptions(o).num_workers(workers).prefetch_factor(1));
          check_same(read_epoch(parallel, epoch), expected);
        }
      }
    }
  }
}

TEST_CASE("ParallelLoader's augmentation is seeded per sample, not per worker or epoch", "[data][parallel]") {
  ParallelLoader loader(20, index_sample, ParallelLoaderOptions().batch_size(5).shuffle(false).num_workers(2));
  const auto e0 = read_epoch(loader, 0);
  const auto e1 = read_epoch(loader, 1);
  // the same sample has different draws in different epochs, different samples differ within one
  CHECK_FALSE(torch::equal(e0[0].target(), e1[0].target()));
  CHECK_FALSE(torch::equal(e0[0].target()[0], e0[0].target()[1]));
  check_same(read_epoch(loader, 0), e0);
}

TEST_CASE("ParallelLoader resumes with set_epoch + skip, and skip loads nothing", "[data][parallel]") {
  // Every sample loaded, by the seed of its generator: a function of (seed, epoch, index), so the samples of
  // one epoch are told from those of another, whenever a worker loaded them.
  std::mutex mutex;
  std::multiset<uint64_t> loaded;
  const auto counted = [&](int64_t i, at::Generator& gen) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      loaded.insert(gen.current_seed());
    }
    return index_sample(i, gen);
  };
  const auto options = ParallelLoaderOptions().batch_size(6).seed(11);
  std::set<uint64_t> epoch2;
  {
    const auto recording = [&](int64_t i, at::Generator& gen) {
      epoch2.insert(gen.current_seed());
      return index_sample(i, gen);
    };
    ParallelLoader serial(60, recording, options);
    read_epoch(serial, 2);
    REQUIRE(epoch2.size() == 60);
  }
  for (const int64_t workers : {0, 2}) {
    SECTION(std::to_string(workers) + " workers") {
      std::optional<ParallelLoader> holder(std::in_place, 60, counted, ParallelLoaderOptions(options).num_workers(workers));
      ParallelLoader& loader = *holder;
      const auto reference = read_epoch(loader, 1);
      // part of epoch 0, then abandon it mid-way (in-flight work is cancelled)
      loader.set_epoch(0);
      REQUIRE(loader.next());
      REQUIRE(loader.next());
      loader.set_epoch(1);
      loader.skip(4);
      std::vector<Batch> rest;
      while (auto b = loader.next()) {
        rest.push_back(*b);
      }
      check_same(rest, std::vector<Batch>(reference.begin() + 4, reference.end()));
      // skip while the workers are loading ahead
      loader.set_epoch(1);
      REQUIRE(loader.next());
      REQUIRE(loader.next());
      loader.skip(3);
      const auto sixth = loader.next();
      REQUIRE(sixth);
      CHECK(torch::equal(sixth->input(), reference[5].input()));
      CHECK(torch::equal(sixth->target(), reference[5].target()));
      // skipping needs no loading: a fresh epoch skipped to its end loads nothing, counted once the workers
      // are joined (what epoch 1 still had in flight is epoch 1's)
      loader.set_epoch(2);
      loader.skip(loader.num_batches());
      CHECK_FALSE(loader.next());
      holder.reset();
      int64_t loaded_in_epoch2 = 0;
      for (const uint64_t seed : loaded) {
        loaded_in_epoch2 += epoch2.count(seed) > 0 ? 1 : 0;
      }
      CHECK(loaded_in_epoch2 == 0);
      CHECK(loaded.size() >= 60);  // epoch 1 was read whole
    }
  }
}

TEST_CASE("ParallelLoader cancels the batches in flight: a worker stops at the sample it is loading",
          "[data][parallel]") {
  // 2 workers, 1 batch each ahead, 5 batches of 4 in order. Each worker is held inside the first sample of
  // batch 1 and batch 2 while the consumer moves on; once let go, a cancelled batch loads no further sample.
  // Counted after the workers are joined, so that no overshoot can come later than the count.
  constexpr int64_t kBatch = 4;
  const auto options = ParallelLoaderOptions().batch_size(kBatch).shuffle(false).num_workers(2).prefetch_factor(1);
  std::atomic<int64_t> calls{0};
  Gate gate;
  const auto held = [&](int64_t i, at::Generator& gen) {
    ++calls;
    if (i == kBatch || i == 2 * kBatch) {
      gate.pass();
    }
    return index_sample(i, gen);
  };
  std::optional<ParallelLoader> loader(std::in_place, 5 * kBatch, held, options);
  const struct OpenAtExit {  // a failed REQUIRE must not leave the workers held while the loader joins them
    Gate& gate;
    ~OpenAtExit() { gate.open(); }
  } open_at_exit{gate};
  REQUIRE(loader->next());  // batch 0; then batches 1 and 2 are dispatched, one per worker
  gate.wait_for(2);
  REQUIRE(calls.load() == kBatch + 2);
  SECTION("a new epoch") {
    loader->set_epoch(1);
    gate.open();
    CHECK(read_rest(*loader).size() == 5);  // epoch 1 whole (the gate is open)
    loader.reset();
    // without cancelling, batches 1 and 2 of epoch 0 would load whole: 3 more samples each
    CHECK(calls.load() == kBatch + 2 + 5 * kBatch);
  }
  SECTION("skip") {
    loader->skip(2);  // batches 1 and 2
    gate.open();
    const auto third = loader->next();
    REQUIRE(third);
    CHECK(third->input()[0].item<int64_t>() == 3 * kBatch);
    REQUIRE(loader->next());
    CHECK_FALSE(loader->next());
    loader.reset();
    CHECK(calls.load() == kBatch + 2 + 2 * kBatch);  // batches 0, 3 and 4 whole, one sample of 1 and of 2
  }
}

TEST_CASE("ParallelLoader loads at most num_workers * prefetch_factor batches ahead", "[data][parallel]") {
  std::atomic<int64_t> calls{0};
  const auto counted = [&](int64_t i, at::Generator& gen) {
    ++calls;
    return index_sample(i, gen);
  };
  const int64_t batch = 4;
  for (const int64_t read : {1, 2}) {
    SECTION(std::to_string(read) + " batches read") {
      {
        ParallelLoader loader(400, counted,
                              ParallelLoaderOptions().batch_size(batch).num_workers(2).prefetch_factor(2));
        for (int64_t b = 0; b < read; ++b) {
          REQUIRE(loader.next());
        }
        // the batches read, and 4 (2 workers x 2) loaded ahead
        wait_until(calls, (read + 4) * batch);
      }
      CHECK(calls.load() == (read + 4) * batch);  // counted once the workers are joined
    }
  }
}

TEST_CASE("ParallelLoader reports a failing sample by epoch, batch and index, and does not hang",
          "[data][parallel]") {
  const auto failing = [](int64_t i, at::Generator& gen) {
    if (i == 17) {
      throw std::runtime_error("cannot decode image 17");
    }
    return index_sample(i, gen);
  };
  for (const int64_t workers : {0, 3}) {
    SECTION(std::to_string(workers) + " workers") {
      ParallelLoader loader(40, failing,
                            ParallelLoaderOptions().batch_size(5).shuffle(false).num_workers(workers));
      for (int b = 0; b < 3; ++b) {
        REQUIRE(loader.next());
      }
      CHECK_THROWS_MATCHES(loader.next(), std::runtime_error,
                           WhatContains("ParallelLoader: epoch 0, batch 3 (sample 17): cannot decode image 17"));
      // the epoch goes on after the failed batch; the original exception is nested
      const auto after = loader.next();
      REQUIRE(after);
      CHECK(after->input()[0].item<int64_t>() == 20);
      loader.set_epoch(0);
      loader.skip(3);
      try {
        loader.next();
        FAIL("no exception");
      } catch (const std::runtime_error& e) {
        CHECK_THROWS_WITH(std::rethrow_if_nested(e), "cannot decode image 17");
      }
    }  // the destructor joins the workers
  }
  SECTION("collate") {
    ParallelLoader loader(
        10, index_sample, ParallelLoaderOptions().batch_size(5).num_workers(2),
        [](const std::vector<Batch>&) -> Batch { throw std::invalid_argument("shapes differ"); });
    CHECK_THROWS_MATCHES(loader.next(), std::runtime_error, WhatContains("batch 0 (collate): shapes differ"));
  }
}

TEST_CASE("ParallelLoader stops its workers when the consumer stops early", "[data][parallel]") {
  // At most num_workers * prefetch_factor batches are dispatched ahead of the consumer, those being loaded
  // included: after `read` batches have been read, no more than (read + W * P) * B samples are ever loaded,
  // however long one waits, and destroying the loader or starting another epoch loads nothing more.
  constexpr int64_t kWorkers = 4;
  constexpr int64_t kPrefetch = 4;
  constexpr int64_t kBatch = 8;
  constexpr int64_t kRead = 2;
  const auto window = [](int64_t read) { return (read + kWorkers * kPrefetch) * kBatch; };
  const auto options = ParallelLoaderOptions().batch_size(kBatch).num_workers(kWorkers).prefetch_factor(kPrefetch);
  std::atomic<int64_t> calls{0};
  const auto counted = [&calls](int64_t i, at::Generator& gen) {
    ++calls;
    return index_sample(i, gen);
  };
  SECTION("destroyed after two batches") {
    {
      ParallelLoader loader(4000, counted, options);
      for (int64_t b = 0; b < kRead; ++b) {
        REQUIRE(loader.next());
      }
      wait_until(calls, window(kRead));
      REQUIRE(calls.load() == window(kRead));  // the window is full, and no more than full
    }
    CHECK(calls.load() == window(kRead));  // the destructor loaded nothing more
  }
  SECTION("a new epoch after two batches") {
    {
      ParallelLoader loader(4000, counted, options);
      for (int64_t b = 0; b < kRead; ++b) {
        REQUIRE(loader.next());
      }
      wait_until(calls, window(kRead));
      REQUIRE(calls.load() == window(kRead));
      loader.set_epoch(1);  // drops epoch 0's prefetched batches; loads nothing until the next next()
      CHECK(calls.load() == window(kRead));
      REQUIRE(loader.next());
      wait_until(calls, window(kRead) + window(1));
    }
    CHECK(calls.load() == window(kRead) + window(1));  // counted once the workers are joined
  }
  SECTION("never read") {
    { ParallelLoader never_read(4000, counted, options); }
    CHECK(calls.load() == 0);  // loading starts at the first next()
  }
}

TEST_CASE("ParallelLoader's workers use one intra-op thread and leave the caller's setting", "[data][parallel]") {
  const int caller = at::get_num_threads();
  std::mutex mutex;
  std::set<int> seen;
  {
    ParallelLoader loader(32, [&](int64_t i, at::Generator& gen) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        seen.insert(at::get_num_threads());
      }
      return index_sample(i, gen);
    }, ParallelLoaderOptions().batch_size(4).num_workers(2));
    read_epoch(loader, 0);
    CHECK(at::get_num_threads() == caller);
  }
  CHECK(seen == std::set<int>{1});
  CHECK(at::get_num_threads() == caller);
  int fresh = 0;
  std::thread([&] { fresh = at::get_num_threads(); }).join();
  CHECK(fresh == caller);  // threads started later get the caller's default, not the workers' 1
}

TEST_CASE("ParallelLoader over a torch::data data set", "[data][parallel]") {
  trainkit::data::ImageSet set{torch::rand({30, 1, 4, 4}), torch::arange(30, torch::kInt64)};
  trainkit::data::MnistDataset dataset(set);
  ParallelLoader loader(static_cast<int64_t>(*dataset.size()), trainkit::data::from_dataset(dataset),
                        ParallelLoaderOptions().batch_size(8).seed(1).num_workers(2));
  const auto batches = read_epoch(loader, 0);
  REQUIRE(batches.size() == 4);
  for (const auto& b : batches) {
    CHECK(torch::equal(b.input(), set.images.index_select(0, b.target())));
  }
}

TEST_CASE("ParallelLoader rejects bad options by name", "[data][parallel]") {
  CHECK_THROWS_MATCHES(ParallelLoader(0, index_sample), std::invalid_argument, WhatContains("empty"));
  CHECK_THROWS_MATCHES(ParallelLoader(10, nullptr), std::invalid_argument, WhatContains("sample function"));
  CHECK_THROWS_MATCHES(ParallelLoader(10, index_sample, ParallelLoaderOptions().batch_size(0)),
                       std::invalid_argument, WhatContains("batch_size: 0"));
  CHECK_THROWS_MATCHES(ParallelLoader(10, index_sample, ParallelLoaderOptions().num_workers(-1)),
                       std::invalid_argument, WhatContains("num_workers: -1"));
  CHECK_THROWS_MATCHES(ParallelLoader(10, index_sample, ParallelLoaderOptions().prefetch_factor(0)),
                       std::invalid_argument, WhatContains("prefetch_factor: 0"));
  CHECK_THROWS_MATCHES(ParallelLoader(10, index_sample, ParallelLoaderOptions().num_replicas(2).rank(2)),
                       std::invalid_argument, WhatContains("rank 2"));
  ParallelLoader loader(10, index_sample);
  CHECK_THROWS_MATCHES(loader.skip(-1), std::invalid_argument, WhatContains("count: -1"));
  if (!torch::cuda::is_available()) {
    CHECK_THROWS_MATCHES(ParallelLoader(10, index_sample, ParallelLoaderOptions().pin_memory(true)),
                         std::invalid_argument, WhatContains("pin_memory needs a CUDA device"));
  }
}

TEST_CASE("ParallelLoader pins its batches", "[data][parallel][cuda]") {
  if (!torch::cuda::is_available()) {
    TRAINKIT_SKIP("no CUDA device: pinned memory needs a CUDA runtime");
  }
  ParallelLoader loader(16, index_sample, ParallelLoaderOptions().batch_size(4).num_workers(2).pin_memory(true));
  const auto b = loader.next();
  REQUIRE(b);
  CHECK(b->is_pinned());
  const Batch on_gpu = b->to(torch::kCUDA, /*non_blocking=*/true);
  CHECK(torch::equal(on_gpu.target().cpu(), b->target()));
}
