#include "trainkit/dist/ddp.h"

#include <mutex>
#include <sstream>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include "dist/detail/reducer.h"
#include "detail/check.h"

namespace trainkit::dist {

std::vector<std::vector<int64_t>> compute_bucket_assignment(const std::vector<at::Tensor>& params,
                                                            double first_bucket_mb, double bucket_cap_mb) {
  TRAINKIT_CHECK_ARG(first_bucket_mb > 0, "Invalid first_bucket_mb: {}", first_bucket_mb);
  TRAINKIT_CHECK_ARG(bucket_cap_mb > 0, "Invalid bucket_cap_mb: {}", bucket_cap_mb);
  std::vector<std::vector<int64_t>> buckets;
  std::vector<int64_t> current;
  int64_t bytes = 0;
  auto cap = [&] { return (buckets.empty() ? first_bucket_mb : bucket_cap_mb) * 1024.0 * 1024.0; };
  for (int64_t i = static_cast<int64_t>(params.size()) - 1; i >= 0; --i) {
    const auto& p = params[static_cast<size_t>(i)];
    if (!current.empty()) {
      const auto& first = params[static_cast<size_t>(current.front())];
      if (first.scalar_type() != p.scalar_type() || first.device() != p.device()) {
        buckets.push_back(std::move(current));
        current.clear();
        bytes = 0;
      }
    }
    current.push_back(i);
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
    if (static_cast<double>(bytes) >= cap()) {  // like PyTorch: the tensor that reaches the cap closes it
      buckets.push_back(std::move(current));
      current.clear();
      bytes = 0;
    }
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

namespace detail {

namespace {

/// Runs after a parameter's AccumulateGrad: its .grad() holds this backward's (accumulated) gradient.
class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<Reducer> reducer, int64_t index) : reducer_(std::move(reducer)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto reducer = reducer_.lock()) {
      reducer->mark_ready(index_);
    }
    return outputs;
  }

 private:
  std::weak_ptr<Reducer> reducer_;
  int64_t index_;
};

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> group,
                 std::vector<std::vector<int64_t>> buckets, ReducerOptions options)
    : params_(std::move(params)), names_(std::move(names)), group_(std::move(group)), options_(std::move(options)) {
  TRAINKIT_CHECK_ARG(options_.compression == "none" || options_.compression == "fp16" || options_.compression == "bf16",
                     "Invalid gradient compression: '{}' (none, fp16 or bf16)", options_.compression);
  bucket_of_.assign(params_.size(), -1);
  ready_.assign(params_.size(), false);
  for (auto& indices : buckets) {
    Bucket b;
    b.indices = indices;
    int64_t numel = 0;
    for (int64_t i : indices) {
      b.offsets.push_back(numel);
      numel += params_[static_cast<size_t>(i)].numel();
      bucket_of_[static_cast<size_t>(i)] = static_cast<int64_t>(buckets_.size());
    }
    const auto& first = params_[static_cast<size_t>(indices.front())];
    b.flat = at::zeros({numel}, first.options().requires_grad(false));
    buckets_.push_back(std::move(b));
  }
  for (auto& b : buckets_) b.pending = static_cast<int64_t>(b.indices.size());
}

void Reducer::install_hooks(const std::shared_ptr<Reducer>& self) {
  for (size_t i = 0; i < self->params_.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(self->params_[i]);
    TRAINKIT_CHECK_ARG(accumulator, "DistributedDataParallel: parameter {} is not a leaf that requires grad",
                       self->names_[i]);
    accumulator->add_post_hook(std::make_unique<ReadyHook>(self, static_cast<int64_t>(i)));
    self->accumulators_.push_back(std::move(accumulator));  // params only hold them weakly
  }
}

void Reducer::add(int64_t index) { mark_ready(index); }

void Reducer::mark_ready(int64_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_enabled_) {
    return;
  }
  if (!callback_queued_) {
    callback_queued_ = true;
    started_early_ = 0;
    std::weak_ptr<Reducer> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto self = weak.lock()) self->finalize();
    });
  }
  const auto i = static_cast<size_t>(index);
  TRAINKIT_CHECK_ARG(!ready_[i],
                     "DistributedDataParallel: parameter {} got its gradient twice in one backward (reentrant backward "
                     "is not supported)",
                     names_[i]);
  ready_[i] = true;
  ++num_ready_;
  auto& bucket = buckets_[static_cast<size_t>(bucket_of_[i])];
  --bucket.pending;
  if (options_.overlap) {
    launch_ready_buckets();
  }
}

void Reducer::launch(Bucket& bucket) {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < bucket.indices.size(); ++k) {
    const auto& p = params_[static_cast<size_t>(bucket.indices[k])];
    at::Tensor slot = bucket.flat.narrow(0, bucket.offsets[k], p.numel());
    if (p.grad().defined()) {
      slot.copy_(p.grad().reshape({-1}));
    } else {
      slot.zero_();  // an unused parameter (find_unused_parameters) contributes zero
    }
  }
  // Divide before the sum, as PyTorch does, so large sums do not overflow in reduced precision.
  bucket.flat.div_(static_cast<double>(group_->world_size()));
  if (options_.compression == "fp16") {
    bucket.comm = bucket.flat.to(at::kHalf);
  } else if (options_.compression == "bf16") {
    bucket.comm = bucket.flat.to(at::kBFloat16);
  } else {
    bucket.comm = bucket.flat;
  }
  bucket.work = group_->all_reduce(bucket.comm);
  bucket.launched = true;
  if (num_ready_ < params_.size()) ++started_early_;
}

void Reducer::launch_ready_buckets() {
  // Buckets start strictly in order, so that every rank issues its collectives in the same order.
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    launch(buckets_[next_bucket_]);
    ++next_bucket_;
  }
}

void Reducer::reset() {
  std::fill(ready_.begin(), ready_.end(), false);
  num_ready_ = 0;
  next_bucket_ = 0;
  callback_queued_ = false;
  for (auto& b : buckets_) {
    b.pending = static_cast<int64_t>(b.indices.size());
    b.launched = false;
    b.work = Work();
    b.comm = at::Tensor();
  }
}

void Reducer::finalize() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!callback_queued_) {
    return;  // nothing pending (no_sync, or already finalized)
  }
  struct ResetOnExit {
    Reducer* r;
    ~ResetOnExit() { r->reset(); }
  } reset_on_exit{this};
  if (num_ready_ < params_.size()) {
    if (!options_.find_unused_parameters) {
      std::ostringstream unused;
      int64_t count = 0;
      for (size_t i = 0; i < params_.size(); ++i) {
        if (!ready_[i]) {
          if (count++ < 8) unused << (count > 1 ? ", " : "") << names_[i];
        }
      }
      if (count > 8) unused << ", ...";
      // Other ranks are waiting for this rank's all-reduce: they fail at the timeout, naming the collective.
      TRAINKIT_CHECK_ARG(
          false,
          "DistributedDataParallel: {} parameter(s) got no gradient in this backward: {}. Every rank must produce a "
          "gradient for every parameter; construct with find_unused_parameters(true) if some are unused on purpose",
          count, unused.str());
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!ready_[i]) {
        ready_[i] = true;
        --buckets_[static_cast<size_t>(bucket_of_[i])].pending;
      }
    }
    num_ready_ = params_.size();
  }
  launch_ready_buckets();
  at::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    bucket.work.wait();
    if (bucket.comm.data_ptr() != bucket.flat.data_ptr()) {
      bucket.flat.copy_(bucket.comm);
    }
    for (size_t k = 0; k < bucket.indices.size(); ++k) {
      auto& p = params_[static_cast<size_t>(bucket.indices[k])];
      at::Tensor slot = bucket.flat.narrow(0, bucket.offsets[k], p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(slot);
      } else {
        p.mutable_grad() = slot.clone();
      }
    }
  }
  last_started_early_ = started_early_;
}

void Reducer::set_sync(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_enabled_ = enabled;
}

}  // namespace detail

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 DistributedDataParallelOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {
  TRAINKIT_CHECK_ARG(module_, "DistributedDataParallel: module is null");
  TRAINKIT_CHECK_ARG(group_, "DistributedDataParallel: process group is null");
  TRAINKIT_CHECK_ARG(options_.bucket_cap_mb() > 0, "Invalid bucket_cap_mb: {}", options_.bucket_cap_mb());
  TRAINKIT_CHECK_ARG(options_.first_bucket_mb() > 0, "Invalid first_bucket_mb: {}", options_.first_bucket_mb());
  TRAINKIT_CHECK_ARG(
      options_.compression() == "none" || options_.compression() == "fp16" || options_.compression() == "bf16",
      "Invalid compression: '{}' (none, fp16 or bf16)", options_.compression());
  if (group_->world_size() == 1) {
    return;  // nothing to average: no hooks, no cost
  }
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad()) {
      params.push_back(item.value());
      names.push_back(item.key());
    }
  }
  std::vector<at::Tensor> state;
  for (const auto& p : module_->parameters()) state.push_back(p);
  for (const auto& b : module_->buffers()) state.push_back(b);
  group_->broadcast_tensors(state, 0);
  if (params.empty()) {
    return;
  }
  auto buckets = compute_bucket_assignment(params, options_.first_bucket_mb(), options_.bucket_cap_mb());
  detail::ReducerOptions ropts;
  ropts.overlap = options_.overlap();
  ropts.find_unused_parameters = options_.find_unused_parameters();
  ropts.compression = options_.compression();
  reducer_ = std::make_shared<detail::Reducer>(std::move(params), std::move(names), group_, std::move(buckets), ropts);
  detail::Reducer::install_hooks(reducer_);
}

DistributedDataParallel::~DistributedDataParallel() = default;

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_) {
  ddp_.sync_ = false;
  if (ddp_.reducer_) ddp_.reducer_->set_sync(false);
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() {
  ddp_.sync_ = previous_;
  if (ddp_.reducer_) ddp_.reducer_->set_sync(previous_);
}

void DistributedDataParallel::sync_buffers() {
  if (!options_.broadcast_buffers() || group_->world_size() == 1) return;
  auto buffers = module_->buffers();
  if (!buffers.empty()) group_->broadcast_tensors(buffers, 0);
}

void DistributedDataParallel::pre_forward() {
  if (forward_sync_) {
    sync_buffers();
  }
  forward_sync_ = at::GradMode::is_enabled() && sync_;
}

void DistributedDataParallel::finalize() {
  if (reducer_) reducer_->finalize();
}

std::vector<std::vector<int64_t>> DistributedDataParallel::bucket_indices() const {
  std::vector<std::vector<int64_t>> out;
  if (reducer_) {
    for (const auto& b : reducer_->buckets()) out.push_back(b.indices);
  }
  return out;
}

int64_t DistributedDataParallel::buckets_started_early() const {
  return reducer_ ? reducer_->last_started_early() : 0;
}

}  // namespace trainkit::dist
