#pragma once
/// @file
/// ZeRO stages 1 and 2 (Rajbhandari et al. 2020, arXiv 1910.02054) with the partition and the step of
/// Python's `torch.distributed.optim.ZeroRedundancyOptimizer`: each parameter is owned by one rank (largest
/// first, each to the rank with the fewest elements so far), each rank keeps the optimizer state of its own
/// parameters only and steps them with any optimizer, then every owner broadcasts its updated parameters.
///
/// - Stage 1: gradients are averaged in full on every rank (DistributedDataParallel's all-reduce).
/// - Stage 2: the DistributedDataParallel's buckets are regrouped by owner and each is *reduced* to its owner
///   from the gradient hooks during backward (overlapped like DDP's all-reduce); the other ranks drop those
///   gradients once they are copied into the bucket. After backward a rank holds the mean gradients of its
///   own parameters only: gradients, optimizer state and the update are all ~1/world per rank.
///
///     trainkit::dist::DistributedDataParallel ddp(model.ptr(), pg);
///     trainkit::dist::ZeroRedundancyOptimizer zero(ddp, [](std::vector<at::Tensor> p) {
///       return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-3));
///     }, trainkit::dist::ZeroOptions().stage(2));
///     zero.zero_grad(); loss.backward(); zero.clip_grad_norm_(1.0); zero.step();
///
/// The object is a torch::optim::Optimizer with the param groups it was given (one holding every parameter, or
/// several: layer decay, LRs by name, no decay for 1-d tensors); each group's options (what a scheduler sets)
/// are copied to the shard's optimizer before each step, as Python's ZeRO does. The partition is Python's:
/// group by group, largest tensor first, each to the rank with the fewest elements so far (over all groups).
/// Under stage 2 the gradient norm and a GradScaler's inf check must span every rank's shard: use
/// clip_grad_norm_() here and GradScaler::set_found_inf_reducer(found_inf_reducer()); both reduce on the
/// parameters' (and the scaler's) device, through the group's backend for it, and read nothing to the host.
///
/// Why per-parameter ownership and not DeepSpeed's flat partition: DeepSpeed's stage 2 flattens all
/// gradients into one buffer cut into `world` equal slices and reduce-scatters it, so a tensor may straddle
/// two ranks; the shard's optimizer then sees slices, not tensors, and per-tensor rules (LAMB's and LARS's
/// trust ratios, per-tensor state) need extra collectives. Owning whole tensors keeps any optimizer exact
/// at the price of a less even split (the largest tensor bounds it), and a reduce per bucket moves the same
/// bytes as a reduce-scatter of that bucket.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "trainkit/dist/process_group.h"
#include "trainkit/options.h"

namespace trainkit::dist {

class DistributedDataParallel;

/// Makes the local optimizer for one rank's shard of the parameters (one param group).
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;
/// Makes the local optimizer for one rank's shard of several param groups: it gets the groups that hold a
/// parameter of the shard (in the original order, each with its group's options) and must make one param
/// group of each, in that order.
using GroupedOptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::optim::OptimizerParamGroup>)>;
/// The optimizer archive that rank `rank` of a `world_size`-rank run saved in the same checkpoint as the one
/// being loaded (ZeroRedundancyOptimizer::save's output); load() asks it for the shards it needs.
using ShardReader = std::function<std::unique_ptr<torch::serialize::InputArchive>(int64_t rank, int64_t world_size)>;
/// The archive under `part` (e.g. "optimizer" of a checkpoint, or of a FullyShardedDataParallel shard) of each
/// archive that `whole` reads; null where `whole` returns null.
ShardReader nested_shard_reader(ShardReader whole, std::string part);

/// Options of ZeroRedundancyOptimizer.
struct ZeroOptions {
  /// 1: shard the optimizer state; 2: shard the gradients too (needs the DistributedDataParallel
  /// constructor); 3: as 2, but step() broadcasts nothing, since the other ranks hold no copy of a
  /// parameter (made by FullyShardedDataParallel, trainkit/dist/fully_shard.h); 0 is accepted by the config
  /// (`[zero] stage = 0`: no ZeRO) but not by the optimizer.
  TORCH_ARG(int64_t, stage) = 1;

 public:
  /// The options a config sets, by key (`trainkit train`'s [zero]).
  static const OptionBinding<ZeroOptions>& binding() {
    static const auto b = OptionBinding<ZeroOptions>().bind(
        TRAINKIT_OPTION(stage), rule::integer(0, 3),
        "Under `trainkit launch`: 0 = plain DDP, 1 = shard the optimizer state, 2 = shard gradients and optimizer "
        "state, 3 = shard the parameters too (each Sequential child gathered for its forward and recomputed in "
        "backward) (ZeRO)");
    return b;
  }
};

/// ZeRO-1/ZeRO-2 optimizer over a ProcessGroup.
class ZeroRedundancyOptimizer : public torch::optim::Optimizer {
 public:
  /// Stage 1 over `params`, whose gradients something else averages (DistributedDataParallel): partitions
  /// them and builds this rank's optimizer with `factory` over its shard (in the original parameter order).
  /// Throws std::invalid_argument when a rank would own no parameter, or for stage 2 (it needs the DDP).
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group,
                          const OptimizerFactory& factory, ZeroOptions options = {});
  /// Stage 1 or 2 over `ddp`'s parameters (`module()->parameters()` that require grad). Stage 2 switches
  /// `ddp`'s buckets to reduce-to-owner (DistributedDataParallel::reduce_to_owners); keep `ddp` alive.
  ZeroRedundancyOptimizer(DistributedDataParallel& ddp, const OptimizerFactory& factory, ZeroOptions options = {});
  /// Stage 1 over several param groups (each must carry its options), whose gradients something else averages.
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups, std::shared_ptr<ProcessGroup> group,
                          const GroupedOptimizerFactory& factory, ZeroOptions options = {});
  /// Stage 1 or 2 over several param groups of `ddp`'s parameters: together the groups hold each of them
  /// (`module()->parameters()` that require grad) exactly once; std::invalid_argument naming a parameter that
  /// is in no group, in two, or not `ddp`'s.
  ZeroRedundancyOptimizer(DistributedDataParallel& ddp, std::vector<torch::optim::OptimizerParamGroup> groups,
                          const GroupedOptimizerFactory& factory, ZeroOptions options = {});

  /// Copies the param group's options to the shard's optimizer, steps it (`closure` runs first when given),
  /// then broadcasts every parameter from its owner (one message per rank and dtype). Returns the loss.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// Clips the gradients like grad::clip_grad_norm_ by the norm over every rank's gradients: under stage 2
  /// each rank's shard norm (its p-th power; the maximum for p = inf) is all-reduced, under stage 1 every
  /// rank holds all of them. Returns the total norm before clipping (0-dim).
  at::Tensor clip_grad_norm_(double max_norm, double norm_type = 2.0);
  /// Sums a found-inf flag over the ranks (for amp::GradScaler::set_found_inf_reducer; stage 2 needs it, so
  /// that every rank skips the same steps).
  std::function<void(at::Tensor&)> found_inf_reducer() const;

  /// The stage (1, 2 or 3).
  int64_t stage() const { return options_.stage(); }
  /// The optimizer of this rank's shard.
  torch::optim::Optimizer* local_optimizer() { return local_.get(); }
  /// Owner rank of parameter `index` (constructor order: group by group).
  int64_t owner(int64_t index) const { return owner_.at(static_cast<size_t>(index)); }
  /// Parameter indices owned by `rank`.
  std::vector<int64_t> shard(int64_t rank) const;
  /// Bytes of this rank's optimizer state (tensors of its serialized state).
  int64_t local_state_bytes() const;
  /// Bytes of the gradients this rank holds now (stage 2 after backward: its shard's only).
  int64_t local_gradient_bytes() const;

  /// Saves this rank's shard: the partition, the sizes of the param groups, the indices it owns, every
  /// group's options and the shard optimizer's state. Every rank saves its own (one file per rank).
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Loads a shard saved by this rank of a group with the same partition (the same world size and
  /// parameters). A shard of another rank or world size (a run resumed on another number of ranks) needs
  /// the other shards of its checkpoint: with a set_shard_reader() they are read through it and resharded
  /// as load_shards does; without one, std::invalid_argument naming the shards needed.
  void load(torch::serialize::InputArchive& archive) override;
  /// Sets (or clears, with nullptr) where load() reads the other shards of the checkpoint it loads.
  void set_shard_reader(ShardReader reader) { shard_reader_ = std::move(reader); }
  /// Loads from the shards of a run of any world size: `shards[k]` is the archive saved by some rank;
  /// the shards of every rank that owned one of this rank's parameters must be among them. Every
  /// parameter's state moves to its new owner (2 ranks → 1, 1 → 2, ...). std::invalid_argument naming the
  /// rank whose shard is missing, or the parameter whose size differs.
  void load_shards(const std::vector<torch::serialize::InputArchive*>& shards);
  /// Writes this rank's shard to `<dir>/zero_shard_<rank>_of_<world>.pt` (atomic, with a checksum).
  void save_sharded(const std::string& dir) const;
  /// Reads the shard files of `dir` that this rank needs, whatever the world size that wrote them;
  /// errors name the directory or the file.
  void load_sharded(const std::string& dir);
  /// The file name save_sharded() uses.
  static std::string shard_file_name(int64_t rank, int64_t world_size);

 private:
  struct Partition;
  ZeroRedundancyOptimizer(Partition partition, std::shared_ptr<ProcessGroup> group, ZeroOptions options);
  std::vector<at::Tensor> all_params() const;
  std::vector<int64_t> group_sizes() const;
  /// load_shards over `first` and the shards of the same checkpoint that this rank's parameters need.
  void load_with(torch::serialize::InputArchive& first, const ShardReader& read);

  std::shared_ptr<ProcessGroup> group_;
  ZeroOptions options_;
  GroupedOptimizerFactory factory_;
  std::vector<int64_t> owner_;
  std::vector<int64_t> local_groups_;  // the global group of each of the shard optimizer's groups
  std::unique_ptr<torch::optim::Optimizer> local_;
  ShardReader shard_reader_;
};

/// Bytes of the tensors in an optimizer's state, as serialized (what ZeRO divides among ranks).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace trainkit::dist
