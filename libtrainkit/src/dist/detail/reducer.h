#pragma once
// The gradient reducer behind DistributedDataParallel, in the shape of flashlight's reducer: add() marks a
// parameter's gradient ready (called from its AccumulateGrad post hook), finalize() launches what is left
// and waits (queued to run at the end of backward). A bucket with a root (ZeRO-2) is reduced to that rank
// instead of all-reduced: its flat buffer lives only while the reduce is in flight, the other ranks drop
// the bucket's gradients as soon as they are copied into it, and the root gets the means.

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include "trainkit/compat.h"
#include "trainkit/dist/process_group.h"

namespace trainkit::dist::detail {

struct ReducerOptions {
  bool overlap = true;
  bool find_unused_parameters = false;
  std::string compression = "none";
  /// Per bucket: the rank that gets the mean (reduce), or -1 (all-reduce). Empty: all-reduce every bucket.
  std::vector<int64_t> roots;
};

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  struct Bucket {
    std::vector<int64_t> indices;  // parameter indices, in the order they are laid out in `flat`
    std::vector<int64_t> offsets;
    at::Tensor flat;               // gradients / world size, then the reduced mean (root buckets: only in flight)
    int64_t numel = 0;
    int64_t root = -1;             // -1: all-reduce; else the rank that gets the mean
    at::Tensor comm;               // what is all-reduced: `flat` itself or its fp16/bf16 copy
    int64_t pending = 0;           // gradients not yet ready in this backward
    bool launched = false;
    Work work;
  };

  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> group,
          std::vector<std::vector<int64_t>> buckets, ReducerOptions options);
  /// Registers a pre and a post hook on every parameter's gradient accumulator (needs the owning shared_ptr).
  static void install_hooks(const std::shared_ptr<Reducer>& self);
  /// Before a gradient is accumulated into parameter `index`: if this rank owns it through a reduce bucket and
  /// still holds the mean of an earlier synchronising backward, scales that mean by the world size, so that the
  /// next reduce (which divides every contribution by it) adds the new local gradients to the mean, as DDP's
  /// all-reduce does; the other ranks dropped their copy of the mean when they sent it.
  void before_accumulate(int64_t index);

  /// Marks parameter `index`'s gradient ready; starts every bucket that is complete, in order.
  void add(int64_t index);
  void mark_ready(int64_t index);
  /// Starts the remaining buckets, waits for all and writes the means into the gradients.
  void finalize();
  void set_sync(bool enabled);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  int64_t last_started_early() const { return last_started_early_; }
  /// Bytes of the bucket buffers allocated now (all-reduce buckets keep theirs between steps).
  int64_t resident_bytes() const;

 private:
  void launch(Bucket& bucket);
  void launch_ready_buckets();
  void reset();

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<ProcessGroup> group_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> bucket_of_;
  std::vector<bool> ready_;
  std::vector<bool> holds_mean_;  // owner of a reduce bucket's parameter, holding the mean of the last sync
  size_t num_ready_ = 0;
  size_t next_bucket_ = 0;
  bool callback_queued_ = false;
  bool sync_enabled_ = true;
  int64_t started_early_ = 0;
  int64_t last_started_early_ = 0;
  std::vector<compat::AutogradNodePtr> accumulators_;
  std::mutex mutex_;
};

}  // namespace trainkit::dist::detail
