#pragma once
/// @file
/// Adapts any `torch::data` data loader (any dataset, transforms, `Stack` or custom collation, stateless
/// or stateful, with or without workers) to a BatchSource:
///
///   auto loader = torch::data::make_data_loader(
///       dataset.map(torch::data::transforms::Stack<>()), torch::data::samplers::RandomSampler(n),
///       torch::data::DataLoaderOptions().batch_size(64).workers(2));
///   auto source = trainkit::data::from_torch_data(*loader, trainkit::data::TorchDataOptions().seed(0));
///   trainer.fit(source);
///
/// With a seed, each epoch's sampler order is drawn from a generator seeded `seed + epoch` (the global
/// generator is left as it was), so a `RandomSampler`'s epoch e has TensorLoader's order for the same
/// seed and a resumed run sees the same batches.

#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/data/example.h>

#include "trainkit/data/batch_source.h"

namespace trainkit::data {

/// Options of a TorchDataSource.
struct TorchDataOptions {
  /// Seeds the sampler of epoch e with seed + e (std::nullopt: the global generator draws it, as in a
  /// plain loop).
  TORCH_ARG(std::optional<uint64_t>, seed) = std::nullopt;
  /// Batches per epoch when the caller knows it (for exact accumulation windows and progress); the
  /// default leaves it unknown.
  TORCH_ARG(int64_t, num_batches) = BatchSource::kUnknownLength;
};

/// Sets the global CPU generator to `seed` for its lifetime and restores the previous state after.
class ScopedSeed {
 public:
  explicit ScopedSeed(uint64_t seed);
  ~ScopedSeed();
  ScopedSeed(const ScopedSeed&) = delete;
  ScopedSeed& operator=(const ScopedSeed&) = delete;

 private:
  at::Tensor saved_;
};

/// The default conversions of a torch::data batch into a Batch.
inline Batch to_batch(Batch b) { return b; }
/// `Stack<>` output: data is input 0, target is target 0.
inline Batch to_batch(const torch::data::Example<>& e) { return Batch(e.data, e.target); }
/// An unlabelled example: input only.
inline Batch to_batch(const torch::data::Example<at::Tensor, torch::data::example::NoTarget>& e) {
  Batch b;
  b.add_input(e.data);
  return b;
}
/// An uncollated batch (no `Stack`): the examples are stacked.
inline Batch to_batch(const std::vector<torch::data::Example<>>& examples) {
  std::vector<Batch> samples;
  samples.reserve(examples.size());
  for (const auto& e : examples) {
    samples.emplace_back(e.data, e.target);
  }
  return collate_stack(samples);
}

/// A BatchSource over a torch::data loader that the caller owns (it must outlive the source).
/// `convert` maps the loader's batch type to a Batch (default: the to_batch overloads above).
template <class Loader, class Convert>
class TorchDataSource : public BatchSource {
 public:
  TorchDataSource(Loader& loader, TorchDataOptions options, Convert convert)
      : loader_(loader), options_(options), convert_(std::move(convert)) {}

  void set_epoch(int64_t epoch) override {
    if (iterator_ && !exhausted_ && loader_.options().workers > 0) {
      // LibTorch's loader cannot abandon an epoch while workers hold jobs: read out the rest.
      while (next()) {
      }
    }
    iterator_.reset();
    if (options_.seed()) {
      ScopedSeed seeded(*options_.seed() + static_cast<uint64_t>(epoch));
      iterator_.emplace(loader_.begin());
    } else {
      iterator_.emplace(loader_.begin());
    }
    end_.emplace(loader_.end());
    advance_ = false;
    exhausted_ = false;
  }

  std::optional<Batch> next() override {
    if (!iterator_) {
      set_epoch(0);
    }
    if (exhausted_) {
      return std::nullopt;
    }
    if (advance_) {
      ++*iterator_;
    }
    advance_ = true;
    if (*iterator_ == *end_) {
      exhausted_ = true;
      return std::nullopt;
    }
    return convert_(**iterator_);
  }

  int64_t num_batches() const override { return options_.num_batches(); }

 private:
  using Iterator = decltype(std::declval<Loader&>().begin());
  Loader& loader_;
  TorchDataOptions options_;
  Convert convert_;
  std::optional<Iterator> iterator_;
  std::optional<Iterator> end_;
  bool advance_ = false;
  bool exhausted_ = false;
};

/// Wraps `loader` (a torch::data data loader, e.g. `*make_data_loader(...)`) with the default conversion.
template <class Loader>
auto from_torch_data(Loader& loader, TorchDataOptions options = {}) {
  auto convert = [](const auto& b) { return to_batch(b); };
  return TorchDataSource<Loader, decltype(convert)>(loader, options, convert);
}

/// Wraps `loader` with a custom conversion `convert(const LoaderBatch&) -> Batch` (custom collation,
/// several inputs, named tensors).
template <class Loader, class Convert>
TorchDataSource<Loader, Convert> from_torch_data(Loader& loader, TorchDataOptions options, Convert convert) {
  return TorchDataSource<Loader, Convert>(loader, options, std::move(convert));
}

}  // namespace trainkit::data
