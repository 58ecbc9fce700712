#pragma once
// What the data area's loaders share: the order of an epoch (TensorLoader and ParallelLoader must agree
// on it bit for bit) and the seeds of per-sample / per-batch generators.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "detail/check.h"
#include "trainkit/data/sampler.h"

namespace trainkit::data::detail {

/// Samples of an `n`-sample data set that rank `rank` of `num_replicas` iterates per epoch: with
/// `even` shards ceil(n / num_replicas) (DistributedSampler pads by wrapping around), else the samples
/// rank, rank + num_replicas, ... below n (every sample once over all ranks).
inline int64_t shard_size(int64_t n, int64_t num_replicas, int64_t rank, bool even) {
  if (even) {
    return (n + num_replicas - 1) / num_replicas;
  }
  return rank < n ? (n - rank + num_replicas - 1) / num_replicas : 0;
}

/// Batches per epoch of a shard of `shard` samples.
inline int64_t num_batches(int64_t shard, int64_t batch_size, bool drop_last) {
  return drop_last ? shard / batch_size : (shard + batch_size - 1) / batch_size;
}

/// This rank's sample indices of epoch `epoch`, as an int64 CPU tensor of shard_size(n, num_replicas, rank, even)
/// elements: torch.randperm(n) from a CPU generator seeded `seed + epoch` when `shuffle` (else 0..n-1),
/// then DistributedSampler's sharding (pad by wrapping around when `even`, rank r takes every
/// num_replicas-th from r). Undefined when the order is the identity (no shuffle, one replica): callers
/// then slice contiguously.
at::Tensor epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch, int64_t num_replicas, int64_t rank,
                       bool even);

/// Throws std::invalid_argument "<loader>: invalid batch_size: 0" (or num_replicas, rank) for sampler
/// options no loader can follow.
template <class Derived>
void check_sampler(const BasicSamplerOptions<Derived>& o, const char* loader) {
  TRAINKIT_CHECK_ARG(o.batch_size() > 0, "{}: invalid batch_size: {}", loader, o.batch_size());
  TRAINKIT_CHECK_ARG(o.num_replicas() >= 1, "{}: invalid num_replicas: {}", loader, o.num_replicas());
  TRAINKIT_CHECK_ARG(o.rank() >= 0 && o.rank() < o.num_replicas(), "{}: rank {} not in [0, num_replicas={})", loader,
                     o.rank(), o.num_replicas());
}

/// shard_size for a loader's sampler options.
template <class Derived>
int64_t shard_size(int64_t n, const BasicSamplerOptions<Derived>& o) {
  return shard_size(n, o.num_replicas(), o.rank(), o.even_shards());
}

/// epoch_order for a loader's sampler options.
template <class Derived>
at::Tensor epoch_order(int64_t n, const BasicSamplerOptions<Derived>& o, int64_t epoch) {
  return epoch_order(n, o.shuffle(), o.seed(), epoch, o.num_replicas(), o.rank(), o.even_shards());
}

/// Which component draws from a derived seed, so that a sample's generator (ParallelLoader) and a batch's
/// (DeviceSource) of equal numbers never share a stream.
enum class SeedStream : uint64_t { kSample = 1, kDeviceBatch = 2 };

/// One 64-bit seed from (seed, stream, epoch, index), well mixed (SplitMix64's finalizer, Steele et al.
/// 2014), so that neighbouring indices or epochs get unrelated generator streams.
inline uint64_t derive_seed(uint64_t seed, SeedStream stream, int64_t epoch, int64_t index) {
  const auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  return mix(mix(mix(mix(seed) ^ static_cast<uint64_t>(stream)) ^ static_cast<uint64_t>(epoch)) ^
             static_cast<uint64_t>(index));
}

}  // namespace trainkit::data::detail
