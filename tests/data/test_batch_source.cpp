// Batch (several tensors, by position and name, collation), FunctionSource, and the torch::data adapter:
// with a seed, a RandomSampler's epoch order equals TensorLoader's for the same seed; resuming with
// set_epoch + skip sees the same batches; the global generator is left untouched.
#include <torch/torch.h>

#include "data/read_batches.h"
#include "support.h"
#include "trainkit/data/batch.h"
#include "trainkit/data/batch_source.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/data/torch_data.h"

using namespace trainkit;
using trainkit::test::read_rest;
using trainkit::test::WhatContains;

namespace {

void require_same_batches(const std::vector<data::Batch>& a, const std::vector<data::Batch>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("batch " << i);
    REQUIRE(torch::equal(a[i].input(), b[i].input()));
    REQUIRE(torch::equal(a[i].target(), b[i].target()));
  }
}

}  // namespace

TEST_CASE("Batch holds inputs and targets by position and by name", "[data][batch]") {
  data::Batch b(torch::ones({4, 3}), torch::zeros({4}, torch::kLong));
  b.add_input(torch::full({4}, 7, torch::kLong), "lengths").add_target(torch::ones({4, 2}), "mask");
  CHECK(b.size() == 4);
  CHECK(b.inputs().size() == 2);
  CHECK(torch::equal(b.input(1), b.input("lengths")));
  CHECK(torch::equal(b.target("mask"), torch::ones({4, 2})));
  CHECK(b.has_input("lengths"));
  CHECK_FALSE(b.has_target("lengths"));
  CHECK_THROWS_MATCHES(b.input("tokens"), std::out_of_range, WhatContains("no input named \"tokens\" (named inputs: lengths)"));
  CHECK_THROWS_MATCHES(b.target(2), std::out_of_range, WhatContains("no target 2 (the batch has 2)"));
  CHECK_THROWS_MATCHES(b.add_input(torch::ones({4}), "lengths"), std::invalid_argument,
                       WhatContains("a second input named \"lengths\""));
  const data::Batch moved = b.to(torch::kCPU);
  CHECK(moved.input_names() == b.input_names());
  CHECK(torch::equal(moved.target(1), b.target(1)));
}

TEST_CASE("collate_stack stacks each position and names the sample that does not fit", "[data][batch]") {
  std::vector<data::Batch> samples;
  for (int64_t i = 0; i < 3; ++i) {
    data::Batch s(torch::full({2}, static_cast<double>(i)), torch::tensor(i));
    s.add_input(torch::tensor(10 * i), "id");
    samples.push_back(s);
  }
  const data::Batch b = data::collate_stack(samples);
  CHECK(b.size() == 3);
  CHECK(torch::equal(b.input(), torch::tensor({0.0, 0.0, 1.0, 1.0, 2.0, 2.0}).to(torch::kFloat).reshape({3, 2})));
  CHECK(torch::equal(b.input("id"), torch::tensor({0, 10, 20})));
  CHECK(torch::equal(b.target(), torch::tensor({0, 1, 2})));
  samples.push_back(data::Batch(torch::zeros({3}), torch::tensor(int64_t{3})).add_input(torch::tensor(0), "id"));
  CHECK_THROWS_MATCHES(data::collate_stack(samples), std::invalid_argument,
                       WhatContains("sample 3 input 0 is Float [3] but sample 0's is Float [2]"));
  CHECK_THROWS_MATCHES(data::collate_stack({}), std::invalid_argument, WhatContains("no samples"));
}

TEST_CASE("FunctionSource and from_batches yield their batches per epoch and skip without calling", "[data][source]") {
  int64_t calls = 0;
  data::FunctionSource source(
      [&calls](int64_t epoch, int64_t index) -> std::optional<data::Batch> {
        ++calls;
        if (index >= 3 + epoch) {
          return std::nullopt;
        }
        return data::Batch(torch::tensor({epoch, index}), torch::tensor(index));
      });
  CHECK(source.num_batches() == data::BatchSource::kUnknownLength);
  source.set_epoch(1);
  CHECK(read_rest(source).size() == 4);
  source.set_epoch(0);
  source.skip(2);
  calls = 0;
  const auto rest = read_rest(source);
  REQUIRE(rest.size() == 1);
  CHECK(torch::equal(rest[0].input(), torch::tensor({int64_t{0}, int64_t{2}})));
  CHECK(calls == 2);  // batch 2, then the end

  auto fixed = data::from_batches({data::Batch(torch::ones({2}), torch::zeros({2})), data::Batch(torch::ones({1}), torch::zeros({1}))});
  CHECK(fixed.num_batches() == 2);
  fixed.set_epoch(5);
  CHECK(read_rest(fixed).size() == 2);
}

TEST_CASE("a torch::data loader with a seed yields TensorLoader's batches, epoch by epoch", "[data][source][torch_data]") {
  const int64_t n = 50;
  const at::Tensor x = torch::arange(n * 2, torch::kFloat).reshape({n, 2});
  const at::Tensor y = torch::arange(n, torch::kLong);
  data::TensorLoader reference(x, y, data::TensorLoaderOptions().batch_size(8).seed(7));
  struct Pairs : torch::data::datasets::Dataset<Pairs> {
    at::Tensor x, y;
    Pairs(at::Tensor a, at::Tensor b) : x(std::move(a)), y(std::move(b)) {}
    torch::data::Example<> get(size_t i) override {
      return {x[static_cast<int64_t>(i)], y[static_cast<int64_t>(i)]};
    }
    torch::optional<size_t> size() const override { return static_cast<size_t>(x.size(0)); }
  };
  for (const size_t workers : {size_t{0}, size_t{2}}) {
    DYNAMIC_SECTION("workers " << workers) {
      auto pairs = torch::data::make_data_loader(Pairs(x, y).map(torch::data::transforms::Stack<>()),
                                                 torch::data::samplers::RandomSampler(n),
                                                 torch::data::DataLoaderOptions().batch_size(8).workers(workers));
      auto source = data::from_torch_data(*pairs, data::TorchDataOptions().seed(7));
      torch::manual_seed(123);
      const at::Tensor global_before = torch::rand({3});
      torch::manual_seed(123);
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        reference.set_epoch(epoch);
        source.set_epoch(epoch);
        require_same_batches(read_rest(source), read_rest(reference));
      }
      CHECK(torch::equal(torch::rand({3}), global_before));  // the sampler's draws did not touch it
      // resume: epoch 1 from batch 4
      reference.set_epoch(1);
      reference.skip(4);
      source.set_epoch(1);
      source.skip(4);
      require_same_batches(read_rest(source), read_rest(reference));
      // an epoch abandoned half-way can be restarted
      source.set_epoch(2);
      (void)source.next();
      source.set_epoch(0);
      reference.set_epoch(0);
      require_same_batches(read_rest(source), read_rest(reference));
    }
  }
  SECTION("uncollated batches (no Stack) are stacked") {
    auto raw = torch::data::make_data_loader(Pairs(x, y), torch::data::samplers::SequentialSampler(n),
                                             torch::data::DataLoaderOptions().batch_size(16));
    auto source = data::from_torch_data(*raw, data::TorchDataOptions().num_batches(4));
    CHECK(source.num_batches() == 4);
    source.set_epoch(0);
    const auto batches = read_rest(source);
    REQUIRE(batches.size() == 4);
    CHECK(torch::equal(batches[3].target(), torch::arange(48, 50, torch::kLong)));
  }
  SECTION("a custom conversion builds named tensors") {
    auto raw = torch::data::make_data_loader(Pairs(x, y).map(torch::data::transforms::Stack<>()),
                                             torch::data::samplers::SequentialSampler(n),
                                             torch::data::DataLoaderOptions().batch_size(25));
    auto source = data::from_torch_data(*raw, {}, [](const torch::data::Example<>& e) {
      data::Batch b;
      b.add_input(e.data.select(1, 0), "a").add_input(e.data.select(1, 1), "b").add_target(e.target);
      return b;
    });
    source.set_epoch(0);
    const auto batches = read_rest(source);
    REQUIRE(batches.size() == 2);
    CHECK(torch::equal(batches[1].input("b"), x.select(1, 1).narrow(0, 25, 25)));
  }
}
