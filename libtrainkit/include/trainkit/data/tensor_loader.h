#pragma once
/// @file
/// A loader over preloaded tensors: one shuffled index per epoch, batches are `index_select` slices.
/// Far faster than `torch::data` + `Stack` for data sets that fit in memory.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include "trainkit/data/batch_source.h"
#include "trainkit/data/sampler.h"

namespace trainkit::data {

/// Options of a TensorLoader: its sampler (batch size, shuffle, seed, shards).
using TensorLoaderOptions = SamplerOptions;

/// Iterates preloaded tensors in batches. The order of epoch e depends only on (seed, e), never on a
/// global generator, so a run resumed at (epoch, batch) sees exactly the batches it would have seen.
class TensorLoader : public BatchSource {
 public:
  /// `inputs` and `targets` share their first dimension; both stay on their device.
  TensorLoader(at::Tensor inputs, at::Tensor targets, TensorLoaderOptions options = {});

  /// Selects the permutation of `epoch` and restarts at its first batch.
  void set_epoch(int64_t epoch) override;
  /// The epoch last selected with set_epoch.
  int64_t epoch() const { return epoch_; }
  /// The next batch of the epoch (input 0 and target 0), or std::nullopt after the last.
  std::optional<Batch> next() override;
  /// Moves the cursor without slicing.
  void skip(int64_t count) override;
  /// Batch `index` (0-based) of the current epoch (random access; the cursor does not move).
  Batch batch(int64_t index) const;
  /// Number of batches per epoch.
  int64_t num_batches() const override;
  /// Number of samples (of all shards).
  int64_t size() const { return inputs_.size(0); }
  /// Number of samples this rank iterates per epoch: ceil(size / num_replicas) with even shards.
  int64_t shard_size() const;
  /// The options given at construction.
  const TensorLoaderOptions& options() const { return options_; }
  /// All inputs (every shard), as given at construction.
  const at::Tensor& inputs() const { return inputs_; }
  /// All targets (every shard), as given at construction.
  const at::Tensor& targets() const { return targets_; }

 private:
  at::Tensor inputs_;
  at::Tensor targets_;
  TensorLoaderOptions options_;
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;
  at::Tensor order_;  // int64 order of the current epoch (this rank's shard), undefined when neither
};

}  // namespace trainkit::data
