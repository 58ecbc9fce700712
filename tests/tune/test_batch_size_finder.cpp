// Batch-size finder: Lightning's power and binsearch answers on a model that runs out of memory above a
// known size (a test double throwing c10::OutOfMemoryError, as CUDA does) and under a fake memory probe;
// the dataset cap; throughput mode; one real CPU trial against a resident-memory budget; bitwise restore.
#include <sstream>

#include <torch/torch.h>

#include "device/testdev.h"
#include "support.h"
#include "train/state_compare.h"
#include "trainkit/nn/models.h"
#include "trainkit/train/host_memory.h"
#include "trainkit/tune/batch_size_finder.h"

using namespace trainkit;
using Catch::Matchers::Contains;

namespace {

/// A tiny classifier whose forward throws CUDA's out-of-memory error for batches above `limit`.
struct Fixture {
  torch::nn::Linear model{nullptr};
  std::unique_ptr<torch::optim::SGD> opt;
  at::Tensor x;
  at::Tensor y;
  int64_t limit;

  Fixture(int64_t samples, int64_t limit_) : limit(limit_) {
    torch::manual_seed(0);
    model = torch::nn::Linear(8, 3);
    opt = std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
    x = torch::randn({samples, 8});
    y = torch::randint(0, 3, {samples});
  }

  tune::BatchSizeFinder finder() {
    return tune::BatchSizeFinder(
        model.ptr(),
        [this](const trainkit::data::Batch& b) {
          const at::Tensor& in = b.input();
          TORCH_CHECK_WITH(OutOfMemoryError, in.size(0) <= limit,
                           "CUDA out of memory. Tried to allocate for a batch of ", in.size(0));
          return model->forward(in);
        },
        *opt);
  }
};

std::vector<int64_t> sizes(const tune::BatchSizeFinderResult& r) {
  std::vector<int64_t> out;
  for (const auto& t : r.trials) {
    out.push_back(t.batch_size);
  }
  return out;
}

/// Reports batch_size · bytes_per_sample: fails every size above budget / bytes_per_sample.
class FakeProbe : public tune::MemoryProbe {
 public:
  explicit FakeProbe(int64_t bytes_per_sample) : per_sample_(bytes_per_sample) {}
  void begin(int64_t batch_size) override { size_ = batch_size; }
  int64_t end() override { return size_ * per_sample_; }

 private:
  int64_t per_sample_;
  int64_t size_ = 0;
};

}  // namespace

TEST_CASE("power and binsearch answers with Lightning's semantics", "[tune][batch_size]") {
  Fixture f(1000, 100);
  auto finder = f.finder();
  SECTION("power: double until out of memory, answer the last size that fit") {
    const auto r = finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().mode("power"));
    CHECK(r.batch_size == 64);
    CHECK(sizes(r) == std::vector<int64_t>{2, 4, 8, 16, 32, 64, 128});
    CHECK_FALSE(r.trials.back().fits);
    CHECK_THAT(r.trials.back().failure, Contains("out of memory"));
    for (size_t i = 0; i + 1 < r.trials.size(); ++i) {
      CHECK(r.trials[i].fits);
      CHECK(r.trials[i].samples_per_second > 0);
    }
  }
  SECTION("binsearch: then bisect between the last fit and the first failure") {
    const auto r = finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().mode("binsearch"));
    CHECK(r.batch_size == 100);
    CHECK(sizes(r) == std::vector<int64_t>{2, 4, 8, 16, 32, 64, 128, 96, 112, 104, 100, 102, 101});
  }
  SECTION("throughput: every size that fits is timed, the fastest is the answer") {
    const auto r = finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().mode("throughput"));
    double fastest = 0;
    int64_t expected = 0;
    for (const auto& t : r.trials) {
      if (t.fits && t.samples_per_second > fastest) {
        fastest = t.samples_per_second;
        expected = t.batch_size;
      }
    }
    CHECK(r.batch_size == expected);
    CHECK(r.batch_size <= 64);
    CHECK(r.mode == "throughput");
  }
  SECTION("max_trials bounds the growth") {
    CHECK(finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().max_trials(3)).batch_size == 8);
    CHECK(finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().mode("binsearch").max_trials(4)).batch_size ==
          16);
  }
  SECTION("a first size that fails is halved until one fits") {
    f.limit = 5;
    const auto p = finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().init_val(8));
    CHECK(p.batch_size == 4);
    CHECK(sizes(p) == std::vector<int64_t>{8, 4, 8});
    const auto b = finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().init_val(8).mode("binsearch"));
    CHECK(b.batch_size == 5);
    CHECK(sizes(b) == std::vector<int64_t>{8, 4, 6, 5});
  }
  SECTION("nothing fits") {
    f.limit = 0;
    CHECK_THROWS_MATCHES(finder.scale_batch_size(f.x, f.y), std::runtime_error, trainkit::test::WhatContains("no batch size fit"));
  }
}

TEST_CASE("sizes are capped by the data set and max_val", "[tune][batch_size]") {
  Fixture f(50, 1 << 20);
  auto finder = f.finder();
  const auto r = finder.scale_batch_size(f.x, f.y);
  CHECK(r.batch_size == 50);
  CHECK(sizes(r) == std::vector<int64_t>{2, 4, 8, 16, 32, 50});
  const auto b = finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().mode("binsearch").max_val(20));
  CHECK(b.batch_size == 20);
  CHECK(sizes(b) == std::vector<int64_t>{2, 4, 8, 16, 20});
}

TEST_CASE("a memory probe over budget fails the trial", "[tune][batch_size]") {
  Fixture f(1000, 1 << 20);
  auto finder = f.finder();
  finder.set_memory_probe(std::make_shared<FakeProbe>(1000));  // budget 50'000 bytes: fits up to 50
  const auto p = finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().memory_budget(50'000));
  CHECK(p.batch_size == 32);
  CHECK(p.trials.back().batch_size == 64);
  CHECK(p.trials.back().peak_bytes == 64'000);
  CHECK_THAT(p.trials.back().failure, Contains("over the budget"));
  const auto b = finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().mode("binsearch").memory_budget(50'000));
  CHECK(b.batch_size == 50);
}

TEST_CASE("PeakRssProbe measures each trial's own peak", "[tune][batch_size][memory]") {
  tune::PeakRssProbe probe;
  INFO("VmHWM reset works: " << probe.resets_high_water_mark());
  constexpr int64_t kMiB = 1024 * 1024;
  probe.begin(0);
  {
    const at::Tensor big = torch::ones({64 * kMiB / 4});  // 64 MiB, written, so resident
    CHECK(big.sum().item<double>() > 0);
  }
  const int64_t first = probe.end();
  CHECK(first >= 60 * kMiB);
  CHECK(first < 200 * kMiB);
  // A later, smaller trial must not read the earlier peak (VmHWM never decreases without the reset).
  probe.begin(0);
  {
    const at::Tensor small = torch::ones({8 * kMiB / 4});
    CHECK(small.sum().item<double>() > 0);
  }
  const int64_t second = probe.end();
  CHECK(second >= 7 * kMiB);
  CHECK(second < 40 * kMiB);
}

TEST_CASE("PeakRssProbe measures a repeated trial under the host cache", "[tune][batch_size][memory]") {
  // trainkit's CLI caches freed CPU blocks (train.host_cache): a second trial of the same size would reuse
  // the first one's cached block and read as free unless begin() empties the cache. The later test cases of
  // this file run with the cache installed too.
  REQUIRE(trainkit::train::enable_host_caching_allocator());
  tune::PeakRssProbe probe;
  constexpr int64_t kMiB = 1024 * 1024;
  for (int trial = 0; trial < 2; ++trial) {
    probe.begin(0);
    {
      const at::Tensor big = torch::ones({64 * kMiB / 4});
      CHECK(big.sum().item<double>() > 0);
    }
    const int64_t peak = probe.end();
    INFO("trial " << trial << ": " << peak << " bytes");
    CHECK(peak >= 60 * kMiB);
    CHECK(peak < 200 * kMiB);
  }
}

TEST_CASE("a real CPU trial against a resident-memory budget", "[tune][batch_size][memory]") {
  torch::manual_seed(1);
  auto model = nn::make_mlp(nn::MlpOptions().in_features(784).hidden({512}).dropout(0.0).num_classes(10));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  const at::Tensor x = torch::rand({4096, 784});
  const at::Tensor y = torch::randint(0, 10, {4096});
  tune::BatchSizeFinder finder(model.ptr(), [&model](const trainkit::data::Batch& b) {
          const at::Tensor& in = b.input(); return model->forward(in); }, opt);
  constexpr int64_t kBudget = 24 * 1024 * 1024;
  const auto r = finder.scale_batch_size(
      x, y, tune::BatchSizeFinderOptions().init_val(64).steps_per_trial(2).memory_budget(kBudget));
  INFO("answer " << r.batch_size);
  const auto answer = std::find_if(r.trials.begin(), r.trials.end(),
                                   [&r](const tune::BatchSizeTrial& t) { return t.batch_size == r.batch_size; });
  REQUIRE(answer != r.trials.end());
  CHECK(answer->fits);
  CHECK(answer->peak_bytes > 0);
  CHECK(answer->peak_bytes <= kBudget);
  // Power stops at the first failure, which is the budget (the data set has 4096 samples).
  const auto& last = r.trials.back();
  if (!last.fits) {
    CHECK(last.batch_size == 2 * r.batch_size);
    CHECK(last.peak_bytes > kBudget);
    CHECK(last.peak_bytes > answer->peak_bytes);
    CHECK_THAT(last.failure, Contains("budget"));
  } else {
    CHECK(r.batch_size == 4096);
  }
  CHECK(r.batch_size >= 64);
  CHECK(r.batch_size < 4096);  // 4096 × 784 inputs plus activations are far above 24 MiB
}

TEST_CASE("the search restores model, optimizer and RNG bitwise", "[tune][batch_size]") {
  torch::manual_seed(4);
  const at::Tensor x = torch::randn({300, 16});
  const at::Tensor y = x.narrow(1, 0, 4).argmax(1);
  auto make = [] { return nn::make_mlp(nn::MlpOptions().in_features(16).hidden({32}).dropout(0.1).num_classes(4)); };
  torch::manual_seed(5);
  auto model = make();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(3e-3));
  for (int i = 0; i < 3; ++i) {  // some optimizer state
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x.narrow(0, 32 * i, 32)), y.narrow(0, 32 * i, 32)).backward();
    opt.step();
  }
  torch::manual_seed(5);
  auto copy = make();
  torch::optim::Adam copy_opt(copy->parameters(), torch::optim::AdamOptions(3e-3));
  {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < copy->parameters().size(); ++i) {
      copy->parameters()[i].copy_(model->parameters()[i]);
    }
  }
  std::stringstream bytes;
  torch::serialize::OutputArchive oa;
  opt.save(oa);
  oa.save_to(bytes);
  torch::serialize::InputArchive ia;
  ia.load_from(bytes);
  copy_opt.load(ia);
  model->eval();
  torch::manual_seed(99);
  const at::Tensor rng_expected = torch::rand({5});
  torch::manual_seed(99);

  int64_t limit = 70;
  tune::BatchSizeFinder finder(
      model.ptr(),
      [&](const trainkit::data::Batch& b) {
          const at::Tensor& in = b.input();
        TORCH_CHECK_WITH(OutOfMemoryError, in.size(0) <= limit, "CUDA out of memory (test double)");
        return model->forward(in);
      },
      opt);
  for (const std::string mode : {"power", "binsearch", "throughput"}) {
    DYNAMIC_SECTION(mode) {
      const auto r = finder.scale_batch_size(x, y, tune::BatchSizeFinderOptions().mode(mode));
      CHECK(r.batch_size <= 70);
      CHECK(torch::equal(torch::rand({5}), rng_expected));
      trainkit::test::require_bitwise_equal_modules(*model, *copy);
      trainkit::test::require_bitwise_equal_adam(opt, *model, copy_opt, *copy);
      CHECK_FALSE(model->is_training());
    }
  }
  SECTION("also when a trial throws something else") {
    tune::BatchSizeFinder failing(
        model.ptr(),
        [&](const trainkit::data::Batch& b) {
          const at::Tensor& in = b.input();
          TORCH_CHECK(in.size(0) < 0, "shape mismatch (test double)");
          return model->forward(in);
        },
        opt);
    CHECK_THROWS_MATCHES(failing.scale_batch_size(x, y), c10::Error, trainkit::test::WhatContains("shape mismatch"));
    CHECK(torch::equal(torch::rand({5}), rng_expected));
    trainkit::test::require_bitwise_equal_modules(*model, *copy);
    trainkit::test::require_bitwise_equal_adam(opt, *model, copy_opt, *copy);
  }
}

TEST_CASE("on a device, the search restores that device's generator too", "[tune][batch_size][testdev]") {
  const c10::Device device = trainkit::test::test_device();
  torch::manual_seed(4);
  const at::Tensor x = torch::randn({300, 16}).to(device);
  const at::Tensor y = x.narrow(1, 0, 4).argmax(1);
  auto model = nn::make_mlp(nn::MlpOptions().in_features(16).hidden({32}).dropout(0.5).num_classes(4));
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(3e-3));
  torch::manual_seed(99);  // the CPU's and every device's generator
  const at::Tensor cpu_expected = torch::rand({5});
  const at::Tensor device_expected = torch::rand({5}, torch::TensorOptions().device(device));
  torch::manual_seed(99);
  tune::BatchSizeFinder finder(
      model.ptr(),
      [&](const trainkit::data::Batch& b) {
        TORCH_CHECK_WITH(OutOfMemoryError, b.input().size(0) <= 70, "out of memory (test double)");
        return model->forward(b.input());
      },
      opt);
  const auto r = finder.scale_batch_size(x, y, tune::BatchSizeFinderOptions().mode("power"));
  CHECK(r.batch_size <= 70);
  CHECK(torch::equal(torch::rand({5}), cpu_expected));
  // The trials' dropout masks were drawn on the device.
  CHECK(torch::equal(torch::rand({5}, torch::TensorOptions().device(device)).cpu(), device_expected.cpu()));
}

TEST_CASE("bad options and data are named", "[tune][batch_size]") {
  Fixture f(10, 100);
  auto finder = f.finder();
  using trainkit::test::WhatContains;
  CHECK_THROWS_MATCHES(finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().mode("linear")),
                       std::invalid_argument, WhatContains("\"linear\""));
  CHECK_THROWS_MATCHES(finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().steps_per_trial(0)),
                       std::invalid_argument, WhatContains("steps_per_trial: 0"));
  CHECK_THROWS_MATCHES(finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().init_val(0)),
                       std::invalid_argument, WhatContains("init_val: 0"));
  CHECK_THROWS_MATCHES(finder.scale_batch_size(f.x, f.y, tune::BatchSizeFinderOptions().memory_budget(-1)),
                       std::invalid_argument, WhatContains("memory_budget: -1"));
  CHECK_THROWS_MATCHES(finder.scale_batch_size(f.x, f.y.narrow(0, 0, 5)), std::invalid_argument,
                       WhatContains("got 10 and 5"));
}
