#pragma once
/// @file
/// ZeRO stage 3, fully sharded data parallel (Rajbhandari et al. 2020, arXiv 1910.02054; PyTorch's FSDP):
/// every trainable parameter lives on one rank only (its owner, the partition of ZeroRedundancyOptimizer);
/// the other ranks keep its shape but no storage. A *unit* (a submodule the user names) gets its full
/// parameters by a broadcast from their owners right before its forward, frees them right after, gathers
/// them again for its backward and frees each as soon as its gradient is accumulated. Gradients are reduced
/// to their owners from the autograd hooks during backward (ZeRO-2's buckets, overlapped like DDP's
/// all-reduce) and the optimizer steps the owner's parameters only. Between steps a rank holds its own
/// parameters, their gradients and their optimizer state: ~1/world of each, plus one unit while it runs.
///
///     auto net = std::make_shared<Net>();                          // children "block0", "block1", "head"
///     trainkit::dist::FullyShardedDataParallel fsdp(net, {"block0", "block1", "head"}, pg,
///         [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::AdamW>(p); });
///     // Net::forward runs each unit through the FSDP object:
///     //   x = fsdp.run(0, [&](const at::Tensor& in) { return block0->forward(in); }, x);
///     auto& opt = fsdp.optimizer();                                 // a ZeroRedundancyOptimizer (stage 3)
///     opt.zero_grad(); loss.backward(); opt.clip_grad_norm_(1.0); opt.step();
///
/// **Why the user runs the units.** LibTorch's C++ modules have no forward hooks (`forward` is not even
/// virtual), so nothing can gather a unit's parameters behind the model's back: the model's forward calls
/// run() for each unit, which gathers and frees around it.
///
/// **Why recomputation.** run() is trainkit::nn::checkpoint over the unit: its forward runs without
/// autograd, so no activation or parameter of the unit is kept; backward gathers the parameters again,
/// recomputes the unit with autograd and differentiates it (the RNG state, autocast state and in-place
/// buffer updates are handled as activation checkpointing does). The other design, keeping the forward's
/// graph and re-filling the freed storage of the parameters it saved before their backward (FSDP's
/// storage resize), needs a hook that runs before the unit's backward on its *output* gradient and writes
/// behind autograd's version counters; recomputing needs neither, is exact by construction, and is
/// activation checkpointing for free, for one extra forward of each unit.
///
/// **Why whole-tensor ownership** (ZeroRedundancyOptimizer's partition) and not FSDP2's per-parameter dim-0
/// sharding (DTensor) or DeepSpeed's flat buffers cut into `world` equal slices: with slices a tensor
/// straddles ranks, so per-tensor rules (LAMB's and LARS's trust ratios, Adafactor's factored moments)
/// need extra collectives and every optimizer must be slice-aware; owning whole tensors keeps every
/// trainkit and LibTorch optimizer exact unchanged, lets the gradients, the global-norm clip, the
/// GradScaler's found-inf sum, several param groups and the sharded checkpoints (resharded to any number of
/// ranks) be ZeRO-2's, and gathers with one broadcast per owner of a unit. The price is a less even split
/// (bounded by the largest tensor) and a gather per owner instead of one all-gather per unit.
///
/// Accumulation: run every micro-batch but the last inside `ddp().no_sync()` (as with DDP): their gradients
/// accumulate in full on every rank and the last backward reduces them to the owners. Or let every backward
/// reduce (gradients stay sharded between micro-batches, one reduce per micro-batch): the owner adds each
/// reduce to the mean it holds, as DDP's all-reduce would.
/// Parameters that do not require grad and buffers are not sharded: they are broadcast from rank 0 at
/// construction (DDP) and kept in full on every rank.
///
/// Outside run() a parameter that this rank does not own has its shape but no storage (a null data
/// pointer): code that reads every parameter (an EMA of the weights, `model->save`, an export) must use
/// full_state_dict() or save() instead.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "trainkit/dist/ddp.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/dist/zero.h"

namespace trainkit::dist {

/// Options of FullyShardedDataParallel.
struct FullyShardOptions {
  /// The gradient buckets (bucket_cap_mb, first_bucket_mb, overlap, broadcast_buffers) of the
  /// DistributedDataParallel that reduces the gradients to their owners.
  TORCH_ARG(DistributedDataParallelOptions, ddp) = {};
  /// Save the RNG state at a unit's forward and recompute it from there, so dropout draws the same masks
  /// (activation checkpointing's preserve_rng_state).
  TORCH_ARG(bool, preserve_rng_state) = true;
};

/// ZeRO stage 3 over a ProcessGroup: sharded parameters, gradients and optimizer state.
class FullyShardedDataParallel {
 public:
  /// Shards `model`'s trainable parameters over `group` (ZeroRedundancyOptimizer's partition, one param
  /// group) and builds this rank's optimizer with `factory`. `units` names submodules of `model`
  /// (named_modules() keys, e.g. "layer0" or "encoder.block3") that together hold every trainable parameter
  /// exactly once. Rank 0's parameters and buffers are broadcast first. std::invalid_argument naming an
  /// unknown unit, a parameter in no unit or in two, or one that shares its storage.
  FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> model, const std::vector<std::string>& units,
                           std::shared_ptr<ProcessGroup> group, const OptimizerFactory& factory,
                           FullyShardOptions options = {});
  /// The same over several param groups (layer decay, LRs by name, no decay for 1-d tensors): together they
  /// hold each trainable parameter exactly once, each group with its options (ZeroRedundancyOptimizer's
  /// grouped constructor).
  FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> model, const std::vector<std::string>& units,
                           std::shared_ptr<ProcessGroup> group, std::vector<torch::optim::OptimizerParamGroup> groups,
                           const GroupedOptimizerFactory& factory, FullyShardOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  /// Runs unit `unit` (its index in the constructor's list) as `fn(input)`: gathers its parameters, runs
  /// it, frees them; under autograd the backward gathers them again and recomputes the unit (see the file
  /// comment). `fn` must be a deterministic function of the input, the unit's parameters and buffers, the
  /// RNG and autocast states. Collective: every rank runs the same units in the same order.
  at::Tensor run(size_t unit, const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input);
  /// The index of the unit named `name`; std::invalid_argument listing the units when there is none.
  size_t unit_index(const std::string& name) const;
  /// The units' names, in the constructor's order.
  const std::vector<std::string>& unit_names() const;

  /// The optimizer: ZeroRedundancyOptimizer at stage 3 (step() broadcasts nothing; its clip_grad_norm_ and
  /// found_inf_reducer span every rank's shard, as at stage 2).
  ZeroRedundancyOptimizer& optimizer();
  /// The DistributedDataParallel that reduces the gradients (no_sync(), pre_forward() for buffers).
  DistributedDataParallel& ddp();
  /// The process group.
  const std::shared_ptr<ProcessGroup>& process_group() const;
  /// Owner rank of trainable parameter `index` (`model->parameters()` that require grad, in order).
  int64_t owner(int64_t index) const;

  /// Bytes of trainable-parameter storage this rank holds now: its own parameters, plus the units that are
  /// gathered at the moment (none between a forward and a backward, or after backward).
  int64_t local_parameter_bytes() const;
  /// Bytes of the trainable parameters of the largest unit (what a rank gathers at once).
  int64_t largest_unit_bytes() const;
  /// Units whose parameters are gathered now (0 between passes).
  int64_t gathered_units() const;

  /// Every parameter and buffer in full, by name (`named_parameters()`, then `named_buffers()`), on rank 0;
  /// empty on the others. Collective: each unit is gathered and freed in turn.
  torch::OrderedDict<std::string, at::Tensor> full_state_dict();

  /// Saves this rank's shard: the partition, its own parameters, every buffer and frozen parameter, and
  /// the optimizer's shard (ZeroRedundancyOptimizer::save) under "optimizer". Every rank saves its own.
  void save(torch::serialize::OutputArchive& archive) const;
  /// save() without the optimizer: the model's part of this rank's shard, for a checkpoint that saves the
  /// optimizer() on its own (train::Trainer::set_model_state).
  void save_model(torch::serialize::OutputArchive& archive) const;
  /// Loads a shard saved by this rank of a run with the same partition; a shard of another rank or world
  /// size (a run resumed on another number of ranks) reads the shards it needs through set_shard_reader(),
  /// and both the parameters and the optimizer state move to their new owners. std::invalid_argument naming
  /// the shard that is missing or the parameter whose size differs.
  void load(torch::serialize::InputArchive& archive);
  /// load() of what save_model() wrote: the parameters and buffers, not the optimizer (set_shard_reader's
  /// archives are then save_model()'s).
  void load_model(torch::serialize::InputArchive& archive);
  /// Sets (or clears, with nullptr) where load() reads the other shards of the checkpoint it loads (archives
  /// written by save(), or by save_model() for load_model()).
  void set_shard_reader(ShardReader reader);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

/// The units of a Sequential model: the names ("0", "1", ...) of its children that hold a trainable
/// parameter, each child one unit.
std::vector<std::string> sequential_units(const torch::nn::Sequential& model);

/// Runs `model` on `input` as its forward does, each child that is a unit of `fsdp` through fsdp.run() and
/// the others (activations, pooling) directly.
at::Tensor forward_sequential(FullyShardedDataParallel& fsdp, const torch::nn::Sequential& model,
                              const at::Tensor& input);

}  // namespace trainkit::dist
