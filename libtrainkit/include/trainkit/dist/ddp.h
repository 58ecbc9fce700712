#pragma once
/// @file
/// Distributed data parallel with the semantics of Python's `torch.nn.parallel.DistributedDataParallel`:
/// parameters and buffers are broadcast from rank 0 at construction; during backward, gradients are
/// averaged over ranks in buckets (reverse parameter order, the first bucket capped at `first_bucket_mb`,
/// the others at `bucket_cap_mb`) whose asynchronous all-reduce starts from autograd hooks as soon as
/// every gradient of the bucket is ready, so communication overlaps the rest of backward (Li et al.,
/// "PyTorch Distributed", VLDB 2020). When backward returns, every gradient holds the mean over ranks.
///
///     auto pg = trainkit::dist::ProcessGroup::from_env();
///     auto model = trainkit::nn::make_cnn();
///     trainkit::dist::DistributedDataParallel ddp(model, pg);
///     torch::optim::SGD opt(model->parameters(), 0.1);
///     for (...) {
///       opt.zero_grad();
///       loss_fn(model->forward(x), y).backward();   // gradients are averaged over ranks here
///       opt.step();                                  // any optimizer; clip before it if wanted
///     }
///     { auto guard = ddp.no_sync(); loss.backward(); }   // accumulate locally, sync at the next backward
///
/// Every rank sees the same averaged gradients, so a GradScaler's inf/NaN check agrees on all ranks and
/// they all skip the same steps. World size 1: no hooks, nothing to do.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include "trainkit/dist/process_group.h"

namespace trainkit::dist {

/// Options of DistributedDataParallel, with PyTorch's names and defaults.
struct DistributedDataParallelOptions {
  /// Cap of every bucket but the first, in MiB (PyTorch: 25).
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  /// Cap of the first bucket (the last parameters), in MiB (PyTorch: 1), so communication starts early.
  TORCH_ARG(double, first_bucket_mb) = 1.0;
  /// Start each bucket's all-reduce from the autograd hooks (true) or all after backward (false; for
  /// measuring what the overlap gains).
  TORCH_ARG(bool, overlap) = true;
  /// Parameters that get no gradient in a backward: false → error naming them; true → they count as zero.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Broadcast buffers (e.g. BatchNorm statistics) from rank 0 before every forward (call
  /// sync_buffers() before forward).
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// Gradient compression of the all-reduce: "none", "fp16" or "bf16" (PyTorch's fp16/bf16_compress_hook).
  TORCH_ARG(std::string, compression) = "none";

 public:
  /// The options a config sets, by key, with their rules and help (`trainkit train`'s [distributed]).
  static const OptionBinding<DistributedDataParallelOptions>& binding() {
    static const auto b = OptionBinding<DistributedDataParallelOptions>().bind(
        TRAINKIT_OPTION(bucket_cap_mb), rule::number(positive()),
        "DDP gradient bucket size in MiB (train.batch_size is per rank)");
    return b;
  }
};

namespace detail {
class Reducer;
}

/// Wraps a module for data-parallel training over a ProcessGroup. The module stays the user's; this object
/// owns the gradient hooks, so keep it alive while training.
class DistributedDataParallel {
 public:
  /// Broadcasts `module`'s parameters and buffers from rank 0 and installs the gradient hooks.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group,
                          DistributedDataParallelOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// Guard of `no_sync()`: while alive, backward only accumulates local gradients.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  /// Disables gradient synchronisation for the backward passes in the guard's scope (accumulation); the
  /// next backward outside it averages the accumulated gradients.
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  /// Whether the next backward synchronises.
  bool require_backward_grad_sync() const { return sync_; }

  /// Broadcasts buffers from rank 0 if `broadcast_buffers`.
  void sync_buffers();
  /// Call before every forward of the module: broadcasts the buffers as PyTorch's DDP.forward does, i.e.
  /// unless the previous forward ran without gradient synchronisation (an evaluation forward, or one
  /// inside no_sync()), so every rank trains and evaluates with rank 0's BatchNorm statistics.
  void pre_forward();
  /// Waits for every pending bucket; backward already calls it at its end, so only needed after a backward
  /// driven by hand. Throws DistError when a peer failed.
  void finalize();

  /// The wrapped module.
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  /// The group.
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }
  /// Parameter indices (in `module()->parameters()` order) of every bucket, in launch order.
  std::vector<std::vector<int64_t>> bucket_indices() const;
  /// Buckets whose all-reduce started inside backward, i.e. before the last gradient was ready, in the
  /// last synchronised backward (the overlap at work).
  int64_t buckets_started_early() const;
  /// The options.
  const DistributedDataParallelOptions& options() const { return options_; }
  /// ZeRO-2 (ZeroRedundancyOptimizer stage 2 calls it): from now on each bucket holds the gradients of one
  /// owner and is reduced to that rank instead of all-reduced; the other ranks drop those gradients as
  /// soon as they are copied into the bucket, so after backward a rank holds the means of the parameters it
  /// owns only. `owner[i]` is the rank of parameter i (`module()->parameters()` that require grad, in
  /// order). Buckets: compute_owner_bucket_assignment. No-op at world size 1. Call between backwards.
  void reduce_to_owners(const std::vector<int64_t>& owner);
  /// Bytes of gradient bucket buffers allocated now: all-reduce buckets keep theirs (a second copy of the
  /// gradients), reduce-to-owner buckets allocate theirs only while their reduce is in flight.
  int64_t bucket_bytes() const;

 private:
  std::vector<at::Tensor> trained_parameters() const;
  void install_reducer(std::vector<std::vector<int64_t>> buckets, std::vector<int64_t> roots);

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DistributedDataParallelOptions options_;
  std::shared_ptr<detail::Reducer> reducer_;
  bool sync_ = true;
  bool forward_sync_ = true;  // PyTorch's require_forward_param_sync
};

/// Assigns parameters to buckets the way PyTorch's DDP does: in reverse order, a new bucket whenever adding
/// a tensor would pass the cap (first cap for the first bucket) or the dtype/device changes.
/// Returns parameter indices per bucket.
std::vector<std::vector<int64_t>> compute_bucket_assignment(const std::vector<at::Tensor>& params,
                                                            double first_bucket_mb, double bucket_cap_mb);

/// The buckets of ZeRO-2: as compute_bucket_assignment (reverse order, first cap, then bucket_cap_mb, a new
/// bucket when the dtype or device changes), but each bucket holds the parameters of one owner only (one
/// open bucket per owner). Buckets are listed in the order they close; `roots` (when given) receives each
/// bucket's owner.
std::vector<std::vector<int64_t>> compute_owner_bucket_assignment(const std::vector<at::Tensor>& params,
                                                                  const std::vector<int64_t>& owner,
                                                                  double first_bucket_mb, double bucket_cap_mb,
                                                                  std::vector<int64_t>* roots = nullptr);

}  // namespace trainkit::dist
