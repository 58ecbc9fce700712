#include "data/detail/epoch_order.h"

#include <algorithm>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace trainkit::data::detail {

at::Tensor epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch, int64_t num_replicas, int64_t rank,
                       bool even) {
  at::Tensor order;
  if (shuffle) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + static_cast<uint64_t>(epoch));
    order = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kInt64));
  }
  if (num_replicas > 1) {
    // DistributedSampler: pad to a multiple of num_replicas by wrapping around, then stride by rank.
    if (!order.defined()) {
      order = torch::arange(n, torch::TensorOptions().dtype(torch::kInt64));
    }
    if (!even) {  // every sample once over the ranks: shards differ in size by at most one
      return order.slice(0, std::min(rank, n), n, num_replicas).contiguous();
    }
    const int64_t total = shard_size(n, num_replicas, rank, true) * num_replicas;
    while (order.size(0) < total) {
      order = torch::cat({order, order.narrow(0, 0, std::min(order.size(0), total - order.size(0)))});
    }
    order = order.narrow(0, rank, total - rank).slice(0, 0, c10::nullopt, num_replicas).contiguous();
  }
  return order;
}

}  // namespace trainkit::data::detail
