#pragma once
/// @file
/// A loader over preloaded tensors: one shuffled index per epoch, batches are `index_select` slices.
/// Far faster than `torch::data` + `Stack` for data sets that fit in memory.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "trainkit/data/batch_source.h"

namespace trainkit::data {

/// Options of a TensorLoader.
struct TensorLoaderOptions {
  /// Samples per batch.
  TORCH_ARG(int64_t, batch_size) = 64;
  /// Reshuffle every epoch (deterministically from `seed` and the epoch number).
  TORCH_ARG(bool, shuffle) = true;
  /// Drop the last incomplete batch.
  TORCH_ARG(bool, drop_last) = false;
  /// Seed of the per-epoch permutation: epoch e uses seed + e, so any epoch can be replayed.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Number of data-parallel ranks sharing the data (PyTorch's DistributedSampler `num_replicas`): the
  /// epoch's order is padded by wrapping around to a multiple of it and rank r takes every
  /// num_replicas-th sample starting at r, so the ranks see disjoint shards of equal size.
  TORCH_ARG(int64_t, num_replicas) = 1;
  /// This rank's shard, in [0, num_replicas).
  TORCH_ARG(int64_t, rank) = 0;
  /// With several replicas: pad the epoch's order to a multiple of num_replicas so every shard has
  /// ceil(size / num_replicas) samples (DistributedSampler; for training, where ranks must step together),
  /// or, when false, give every sample to exactly one rank, shards differing by at most one sample (for
  /// evaluation whose sums are reduced across ranks: nothing is counted twice).
  TORCH_ARG(bool, even_shards) = true;
};

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
