// TensorLoader: the epoch order equals torch.randperm with a generator seeded seed + epoch (golden from
// Python), batches cover every sample once, and drop_last / no-shuffle behave.
#include <algorithm>
#include <numeric>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/data/tensor_loader.h"

using trainkit::data::TensorLoader;
using trainkit::data::TensorLoaderOptions;

TEST_CASE("TensorLoader's order matches Python's torch.randperm with the same seed", "[data][loader]") {
  const auto& golden = trainkit::test::golden("data.toml");
  const at::Tensor inputs = torch::arange(55000, torch::kInt64);
  for (const uint64_t seed : {0ull, 1ull, 12345ull}) {
    SECTION("seed " + std::to_string(seed)) {
      // epoch e uses seed + e; ask for epoch 0 with the seed itself
      TensorLoader loader(inputs, inputs, TensorLoaderOptions().batch_size(32).seed(seed));
      loader.set_epoch(0);
      const auto& expected = *golden["randperm_55000"]["seed_" + std::to_string(seed)].as_array();
      const at::Tensor first = loader.batch(0).input();
      REQUIRE(first.size(0) == 32);
      for (size_t i = 0; i < expected.size(); ++i) {
        CHECK(first[static_cast<int64_t>(i)].item<int64_t>() == expected[i].value<int64_t>().value());
      }
    }
  }
}

TEST_CASE("TensorLoader covers every sample once per epoch", "[data][loader]") {
  const at::Tensor inputs = torch::arange(103, torch::kInt64);
  const at::Tensor targets = inputs * 10;
  SECTION("shuffled, last batch short") {
    TensorLoader loader(inputs, targets, TensorLoaderOptions().batch_size(10).seed(7));
    REQUIRE(loader.num_batches() == 11);
    for (int64_t epoch : {0, 3}) {
      loader.set_epoch(epoch);
      std::vector<at::Tensor> seen;
      for (int64_t b = 0; b < loader.num_batches(); ++b) {
        const auto batch = loader.batch(b);
        CHECK(torch::equal(batch.target(), batch.input() * 10));
        seen.push_back(batch.input());
      }
      CHECK(seen.back().size(0) == 3);
      CHECK(torch::equal(std::get<0>(torch::cat(seen).sort()), inputs));
    }
    loader.set_epoch(0);
    const at::Tensor e0 = loader.batch(0).input().clone();
    loader.set_epoch(1);
    CHECK_FALSE(torch::equal(e0, loader.batch(0).input()));
    loader.set_epoch(0);
    CHECK(torch::equal(e0, loader.batch(0).input()));  // any epoch can be replayed
  }
  SECTION("drop_last and sequential order") {
    TensorLoader loader(inputs, targets, TensorLoaderOptions().batch_size(10).shuffle(false).drop_last(true));
    REQUIRE(loader.num_batches() == 10);
    CHECK(torch::equal(loader.batch(9).input(), torch::arange(90, 100, torch::kInt64)));
    CHECK_THROWS_WITH(loader.batch(10), Catch::Matchers::Contains("out of range"));
  }
  SECTION("bad arguments") {
    CHECK_THROWS_WITH(TensorLoader(inputs, targets.narrow(0, 0, 5)), Catch::Matchers::Contains("targets"));
    CHECK_THROWS_WITH(TensorLoader(inputs, targets, TensorLoaderOptions().batch_size(0)),
                      Catch::Matchers::Contains("batch_size"));
  }
}

TEST_CASE("TensorLoader with uneven shards gives every sample to exactly one rank", "[data][loader]") {
  const at::Tensor inputs = torch::arange(10, torch::kInt64);
  for (const bool shuffle : {false, true}) {
    DYNAMIC_SECTION("shuffle " << shuffle) {
      std::vector<int64_t> seen;
      std::vector<int64_t> sizes;
      for (int64_t rank = 0; rank < 4; ++rank) {
        TensorLoader loader(inputs, inputs, TensorLoaderOptions().batch_size(2).shuffle(shuffle).seed(3)
                                                .num_replicas(4).rank(rank).even_shards(false));
        loader.set_epoch(1);
        sizes.push_back(loader.shard_size());
        while (auto b = loader.next()) {
          for (int64_t i = 0; i < b->size(); ++i) {
            seen.push_back(b->input()[i].item<int64_t>());
          }
        }
      }
      CHECK(sizes == std::vector<int64_t>{3, 3, 2, 2});
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(10);
      std::iota(all.begin(), all.end(), 0);
      CHECK(seen == all);
    }
  }
  SECTION("more ranks than samples: the extra ranks have nothing") {
    TensorLoader loader(torch::arange(2), torch::arange(2),
                        TensorLoaderOptions().num_replicas(3).rank(2).even_shards(false));
    CHECK(loader.num_batches() == 0);
    CHECK_FALSE(loader.next().has_value());
  }
}
