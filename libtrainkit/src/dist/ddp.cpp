#include "trainkit/dist/ddp.h"

#include <algorithm>
#include <mutex>
#include <sstream>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include "dist/detail/reducer.h"
#include "detail/check.h"

namespace trainkit::dist {

std::vector<std::vector<int64_t>> compute_owner_bucket_assignment(const std::vector<at::Tensor>& params,
                                                                  const std::vector<int64_t>& owner,
                                                                  double first_bucket_mb, double bucket_cap_mb,
                                                                  std::vector<int64_t>* roots) {
  TRAINKIT_CHECK_ARG(first_bucket_mb > 0, "Invalid first_bucket_mb: {}", first_bucket_mb);
  TRAINKIT_CHECK_ARG(bucket_cap_mb > 0, "Invalid bucket_cap_mb: {}", bucket_cap_mb);
  TRAINKIT_CHECK_ARG(owner.size() == params.size(), "compute_owner_bucket_assignment: {} owners for {} parameters",
                     owner.size(), params.size());
  struct Open {
    int64_t owner = -1;
    std::vector<int64_t> indices;
    int64_t bytes = 0;
    bool first = true;  // no bucket of this owner closed yet
  };
  std::vector<std::vector<int64_t>> buckets;
  std::vector<int64_t> bucket_roots;
  std::vector<Open> open;  // one per owner, in first-seen order
  const auto close = [&](Open& o) {
    if (o.indices.empty()) return;
    buckets.push_back(std::move(o.indices));
    bucket_roots.push_back(o.owner);
    o.indices.clear();
    o.bytes = 0;
    o.first = false;
  };
  for (int64_t i = static_cast<int64_t>(params.size()) - 1; i >= 0; --i) {
    const auto& p = params[static_cast<size_t>(i)];
    const int64_t r = owner[static_cast<size_t>(i)];
    auto it = std::find_if(open.begin(), open.end(), [r](const Open& o) { return o.owner == r; });
    if (it == open.end()) {
      open.push_back(Open{r, {}, 0, true});
      it = std::prev(open.end());
    }
    if (!it->indices.empty()) {
      const auto& head = params[static_cast<size_t>(it->indices.front())];
      if (head.scalar_type() != p.scalar_type() || head.device() != p.device()) close(*it);
    }
    it->indices.push_back(i);
    it->bytes += p.numel() * static_cast<int64_t>(p.element_size());
    if (static_cast<double>(it->bytes) >= (it->first ? first_bucket_mb : bucket_cap_mb) * 1024.0 * 1024.0) close(*it);
  }
  for (auto& o : open) close(o);
  if (roots != nullptr) *roots = std::move(bucket_roots);
  return buckets;
}

std::vector<std::vector<int64_t>> compute_bucket_assignment(const std::vector<at::Tensor>& params,
                                                            double first_bucket_mb, double bucket_cap_mb) {
  // One owner: every parameter in the one sequence of buckets.
  return compute_owner_bucket_assignment(params, std::vector<int64_t>(params.size(), 0), first_bucket_mb,
                                         bucket_cap_mb);
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

/// Calls Reducer::before_accumulate before a parameter's gradient accumulator adds the new gradient.
class AccumulateHook : public torch::autograd::FunctionPreHook {
 public:
  AccumulateHook(std::weak_ptr<Reducer> reducer, int64_t index) : reducer_(std::move(reducer)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (auto reducer = reducer_.lock()) {
      reducer->before_accumulate(index_);
    }
    return grads;
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
  TRAINKIT_CHECK_ARG(options_.roots.empty() || options_.roots.size() == buckets.size(),
                     "Reducer: {} bucket roots for {} buckets", options_.roots.size(), buckets.size());
  bucket_of_.assign(params_.size(), -1);
  ready_.assign(params_.size(), false);
  holds_mean_.assign(params_.size(), false);
  for (auto& indices : buckets) {
    Bucket b;
    b.indices = indices;
    for (int64_t i : indices) {
      b.offsets.push_back(b.numel);
      b.numel += params_[static_cast<size_t>(i)].numel();
      bucket_of_[static_cast<size_t>(i)] = static_cast<int64_t>(buckets_.size());
    }
    b.root = options_.roots.empty() ? -1 : options_.roots[buckets_.size()];
    if (b.root < 0) {  // all-reduce buckets keep their buffer; reduced ones allocate it per backward
      const auto& first = params_[static_cast<size_t>(indices.front())];
      b.flat = at::zeros({b.numel}, first.options().requires_grad(false));
    }
    buckets_.push_back(std::move(b));
  }
  for (auto& b : buckets_) b.pending = static_cast<int64_t>(b.indices.size());
}

void Reducer::install_hooks(const std::shared_ptr<Reducer>& self) {
  for (size_t i = 0; i < self->params_.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(self->params_[i]);
    TRAINKIT_CHECK_ARG(accumulator, "DistributedDataParallel: parameter {} is not a leaf that requires grad",
                       self->names_[i]);
    accumulator->add_pre_hook(std::make_unique<AccumulateHook>(self, static_cast<int64_t>(i)));
    accumulator->add_post_hook(std::make_unique<ReadyHook>(self, static_cast<int64_t>(i)));
    self->accumulators_.push_back(std::move(accumulator));  // params only hold them weakly
  }
}

void Reducer::add(int64_t index) { mark_ready(index); }

void Reducer::before_accumulate(int64_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto i = static_cast<size_t>(index);
  if (!holds_mean_[i]) {
    return;
  }
  holds_mean_[i] = false;
  auto& p = params_[i];
  if (p.grad().defined()) {  // zero_grad() may have set it to none since
    at::NoGradGuard no_grad;
    p.mutable_grad().mul_(static_cast<double>(group_->world_size()));
  }
}

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
  if (bucket.root >= 0) {
    const auto& first = params_[static_cast<size_t>(bucket.indices.front())];
    bucket.flat = at::empty({bucket.numel}, first.options().requires_grad(false));
  }
  const bool drop = bucket.root >= 0 && bucket.root != group_->rank();
  for (size_t k = 0; k < bucket.indices.size(); ++k) {
    auto& p = params_[static_cast<size_t>(bucket.indices[k])];
    at::Tensor slot = bucket.flat.narrow(0, bucket.offsets[k], p.numel());
    if (p.grad().defined()) {
      slot.copy_(p.grad().reshape({-1}));
    } else {
      slot.zero_();  // an unused parameter (find_unused_parameters) contributes zero
    }
    if (drop) {
      p.mutable_grad() = at::Tensor();  // ZeRO-2: another rank owns it; the bucket carries it from here
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
  bucket.work = bucket.root >= 0 ? group_->reduce(bucket.comm, bucket.root) : group_->all_reduce(bucket.comm);
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
    if (b.root >= 0) b.flat = at::Tensor();
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
    if (bucket.root >= 0 && bucket.root != group_->rank()) {
      bucket.flat = at::Tensor();  // the gradients were dropped at launch; the owner has the mean
      bucket.comm = at::Tensor();
      continue;
    }
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
      if (bucket.root >= 0) holds_mean_[static_cast<size_t>(bucket.indices[k])] = true;
    }
    if (bucket.root >= 0) {
      bucket.flat = at::Tensor();
      bucket.comm = at::Tensor();
    }
  }
  last_started_early_ = started_early_;
}

int64_t Reducer::resident_bytes() const {
  int64_t bytes = 0;
  for (const auto& b : buckets_) {
    if (b.flat.defined()) bytes += static_cast<int64_t>(b.flat.nbytes());
    if (b.comm.defined() && b.comm.data_ptr() != b.flat.data_ptr()) bytes += static_cast<int64_t>(b.comm.nbytes());
  }
  return bytes;
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
  std::vector<at::Tensor> state;
  for (const auto& p : module_->parameters()) state.push_back(p);
  for (const auto& b : module_->buffers()) state.push_back(b);
  group_->broadcast_tensors(state, 0);
  const auto params = trained_parameters();
  if (params.empty()) {
    return;
  }
  install_reducer(compute_bucket_assignment(params, options_.first_bucket_mb(), options_.bucket_cap_mb()), {});
}

std::vector<at::Tensor> DistributedDataParallel::trained_parameters() const {
  std::vector<at::Tensor> params;
  for (const auto& p : module_->parameters(/*recurse=*/true)) {
    if (p.requires_grad()) params.push_back(p);
  }
  return params;
}

void DistributedDataParallel::install_reducer(std::vector<std::vector<int64_t>> buckets, std::vector<int64_t> roots) {
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad()) {
      params.push_back(item.value());
      names.push_back(item.key());
    }
  }
  detail::ReducerOptions ropts;
  ropts.overlap = options_.overlap();
  ropts.find_unused_parameters = options_.find_unused_parameters();
  ropts.compression = options_.compression();
  ropts.roots = std::move(roots);
  // The hooks of a replaced reducer hold it weakly: they do nothing once it is gone.
  reducer_ = std::make_shared<detail::Reducer>(std::move(params), std::move(names), group_, std::move(buckets), ropts);
  detail::Reducer::install_hooks(reducer_);
  if (!sync_) reducer_->set_sync(false);
}

void DistributedDataParallel::reduce_to_owners(const std::vector<int64_t>& owner) {
  if (!reducer_) {
    return;  // world size 1 (or nothing to train): every gradient is already this rank's
  }
  const auto params = trained_parameters();
  TRAINKIT_CHECK_ARG(owner.size() == params.size(),
                     "DistributedDataParallel::reduce_to_owners: {} owners for {} parameters that require grad",
                     owner.size(), params.size());
  for (size_t i = 0; i < owner.size(); ++i) {
    TRAINKIT_CHECK_ARG(owner[i] >= 0 && owner[i] < group_->world_size(),
                       "DistributedDataParallel::reduce_to_owners: parameter {} has owner {}, not in [0, {})", i,
                       owner[i], group_->world_size());
  }
  std::vector<int64_t> roots;
  auto buckets = compute_owner_bucket_assignment(params, owner, options_.first_bucket_mb(), options_.bucket_cap_mb(), &roots);
  install_reducer(std::move(buckets), std::move(roots));
}

int64_t DistributedDataParallel::bucket_bytes() const { return reducer_ ? reducer_->resident_bytes() : 0; }

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
