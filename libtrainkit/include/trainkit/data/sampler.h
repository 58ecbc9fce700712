#pragma once
/// @file
/// The order in which a loader visits a data set: samples per batch, a per-epoch shuffle and PyTorch's
/// DistributedSampler sharding. TensorLoader and ParallelLoader take the same sampler options, so that the
/// same options give both loaders the same order, bit for bit:
///
///     auto order = [](auto options) { return options.batch_size(64).seed(0).num_replicas(2).rank(1); };
///     data::TensorLoader a(x, y, order(data::TensorLoaderOptions()));
///     data::ParallelLoader b(n, sample, order(data::ParallelLoaderOptions()).num_workers(4));

#include <cstdint>

namespace trainkit::data {

// A TORCH_ARG whose setter returns the Derived options, so that a chain that starts with a sampler field
// goes on with the fields of the loader's own options.
#define TRAINKIT_SAMPLER_ARG(T, name)                            \
 public:                                                         \
  Derived& name(const T& new_##name) {                           \
    this->name##_ = new_##name;                                  \
    return static_cast<Derived&>(*this);                         \
  }                                                              \
  const T& name() const noexcept { return this->name##_; }       \
  T& name() noexcept { return this->name##_; }                   \
                                                                 \
 private:                                                        \
  T name##_

/// The sampler fields of a loader's options `Derived` (SamplerOptions, ParallelLoaderOptions), whose
/// setters return `Derived&`.
template <class Derived>
struct BasicSamplerOptions {
  /// Samples per batch.
  TRAINKIT_SAMPLER_ARG(int64_t, batch_size) = 64;
  /// Reshuffle every epoch (deterministically from `seed` and the epoch number).
  TRAINKIT_SAMPLER_ARG(bool, shuffle) = true;
  /// Drop the last incomplete batch.
  TRAINKIT_SAMPLER_ARG(bool, drop_last) = false;
  /// Seed of the per-epoch permutation: epoch e uses seed + e, so any epoch can be replayed.
  TRAINKIT_SAMPLER_ARG(uint64_t, seed) = 0;
  /// Number of data-parallel ranks sharing the data (PyTorch's DistributedSampler `num_replicas`): the
  /// epoch's order is padded by wrapping around to a multiple of it and rank r takes every
  /// num_replicas-th sample starting at r, so the ranks see disjoint shards of equal size.
  TRAINKIT_SAMPLER_ARG(int64_t, num_replicas) = 1;
  /// This rank's shard, in [0, num_replicas).
  TRAINKIT_SAMPLER_ARG(int64_t, rank) = 0;
  /// With several replicas: pad the epoch's order to a multiple of num_replicas so every shard has
  /// ceil(size / num_replicas) samples (DistributedSampler; for training, where ranks must step together),
  /// or, when false, give every sample to exactly one rank, shards differing by at most one sample (for
  /// evaluation whose sums are reduced across ranks: nothing is counted twice).
  TRAINKIT_SAMPLER_ARG(bool, even_shards) = true;
};

#undef TRAINKIT_SAMPLER_ARG

/// The sampler options alone: a TensorLoader's options (TensorLoaderOptions).
struct SamplerOptions : BasicSamplerOptions<SamplerOptions> {};

}  // namespace trainkit::data
