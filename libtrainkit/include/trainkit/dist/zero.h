#pragma once
/// @file
/// ZeRO stage 1 (Rajbhandari et al. 2020, arXiv 1910.02054) with the semantics of Python's
/// `torch.distributed.optim.ZeroRedundancyOptimizer`: each parameter is owned by one rank, each rank keeps
/// the optimizer state of its own parameters only and steps them with any optimizer, then every owner
/// broadcasts its updated parameters. Gradients must already be averaged (DistributedDataParallel).
///
///     trainkit::dist::ZeroRedundancyOptimizer zero(model->parameters(), pg, [](std::vector<at::Tensor> p) {
///       return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-3));
///     });
///     loss.backward(); zero.step();

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "trainkit/dist/process_group.h"

namespace trainkit::dist {

/// Makes the local optimizer for one rank's shard of the parameters.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

/// ZeRO-1 optimizer-state sharding over a ProcessGroup.
class ZeroRedundancyOptimizer {
 public:
  /// Partitions `params` like PyTorch (largest first, each to the rank with the fewest elements so far) and
  /// builds this rank's optimizer with `factory` over its shard (in the original parameter order).
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group,
                          const OptimizerFactory& factory);

  /// Steps this rank's shard, then broadcasts every parameter from its owner (one message per rank and dtype).
  void step();
  /// Zeroes (or unsets) every parameter's gradient, not only the shard's.
  void zero_grad(bool set_to_none = true);

  /// The optimizer of this rank's shard (null when the shard is empty); drive its LR with any scheduler.
  torch::optim::Optimizer* local_optimizer() { return local_.get(); }
  /// Owner rank of parameter `index` (constructor order).
  int64_t owner(int64_t index) const { return owner_.at(static_cast<size_t>(index)); }
  /// Parameter indices owned by `rank`.
  std::vector<int64_t> shard(int64_t rank) const;
  /// Bytes of this rank's optimizer state (tensors of its serialized state).
  int64_t local_state_bytes() const;

  /// Saves this rank's shard state with the partition (one file per rank: sharded checkpoints).
  void save(torch::serialize::OutputArchive& archive) const;
  /// Loads a shard saved by the same rank of a group with the same world size and partition.
  void load(torch::serialize::InputArchive& archive);

 private:
  std::vector<at::Tensor> params_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<int64_t> owner_;
  std::unique_ptr<torch::optim::Optimizer> local_;
};

/// Bytes of the tensors in an optimizer's state, as serialized (what ZeRO-1 divides among ranks).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace trainkit::dist
