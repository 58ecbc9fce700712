#include "trainkit/dist/zero.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::dist {

namespace {

int64_t tensor_bytes_in(torch::serialize::InputArchive& archive) {
  int64_t bytes = 0;
  for (const auto& key : archive.keys()) {
    at::Tensor t;
    if (archive.try_read(key, t)) {
      if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
      continue;
    }
    torch::serialize::InputArchive nested;
    if (archive.try_read(key, nested)) bytes += tensor_bytes_in(nested);
  }
  return bytes;
}

}  // namespace

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  // Optimizers keep their state behind type-erased ParamState objects: their serialized form lists the
  // tensors of every optimizer alike.
  torch::serialize::OutputArchive out;
  optimizer.save(out);
  std::ostringstream stream;
  out.save_to(stream);
  std::istringstream in_stream(stream.str());
  torch::serialize::InputArchive in;
  in.load_from(in_stream);
  return tensor_bytes_in(in);
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group,
                                                 const OptimizerFactory& factory)
    : params_(std::move(params)), group_(std::move(group)) {
  TRAINKIT_CHECK_ARG(group_, "ZeroRedundancyOptimizer: process group is null");
  TRAINKIT_CHECK_ARG(factory, "ZeroRedundancyOptimizer: optimizer factory is empty");
  TRAINKIT_CHECK_ARG(!params_.empty(), "ZeroRedundancyOptimizer: no parameters");
  const auto world = group_->world_size();
  // PyTorch's partition: parameters by size, largest first, each to the rank with the smallest total.
  std::vector<size_t> order(params_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params_[a].numel() > params_[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  owner_.assign(params_.size(), 0);
  for (size_t i : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[i] = static_cast<int64_t>(r);
    load[r] += params_[i].numel();
  }
  std::vector<at::Tensor> mine;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] == group_->rank()) mine.push_back(params_[i]);
  }
  if (!mine.empty()) {
    local_ = factory(std::move(mine));
    TRAINKIT_CHECK_ARG(local_, "ZeroRedundancyOptimizer: the factory returned no optimizer");
  }
}

std::vector<int64_t> ZeroRedundancyOptimizer::shard(int64_t rank) const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < owner_.size(); ++i) {
    if (owner_[i] == rank) out.push_back(static_cast<int64_t>(i));
  }
  return out;
}

void ZeroRedundancyOptimizer::step() {
  if (local_) local_->step();
  if (group_->world_size() == 1) return;
  for (int64_t r = 0; r < group_->world_size(); ++r) {
    std::vector<at::Tensor> owned;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] == r) owned.push_back(params_[i]);
    }
    group_->broadcast_tensors(owned, r);
  }
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  for (auto& p : params_) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.mutable_grad() = at::Tensor();
    } else {
      p.mutable_grad().detach_();
      p.mutable_grad().zero_();
    }
  }
}

int64_t ZeroRedundancyOptimizer::local_state_bytes() const { return local_ ? optimizer_state_bytes(*local_) : 0; }

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  archive.write("zero_version", at::tensor(int64_t{1}));
  archive.write("world_size", at::tensor(group_->world_size()));
  archive.write("rank", at::tensor(group_->rank()));
  archive.write("owner", at::tensor(owner_));
  if (local_) {
    torch::serialize::OutputArchive shard_archive;
    local_->save(shard_archive);
    archive.write("shard", shard_archive);
  }
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  at::Tensor version, world, rank, owner;
  archive.read("zero_version", version);
  TRAINKIT_CHECK_ARG(version.item<int64_t>() == 1, "ZeroRedundancyOptimizer: unknown checkpoint version {}",
                     version.item<int64_t>());
  archive.read("world_size", world);
  archive.read("rank", rank);
  archive.read("owner", owner);
  TRAINKIT_CHECK_ARG(world.item<int64_t>() == group_->world_size() && rank.item<int64_t>() == group_->rank(),
                     "ZeroRedundancyOptimizer: checkpoint of rank {} of {} cannot load into rank {} of {}",
                     rank.item<int64_t>(), world.item<int64_t>(), group_->rank(), group_->world_size());
  TRAINKIT_CHECK_ARG(owner.numel() == static_cast<int64_t>(owner_.size()) &&
                         std::equal(owner_.begin(), owner_.end(), owner.data_ptr<int64_t>()),
                     "ZeroRedundancyOptimizer: the checkpoint's parameter partition differs from this one");
  if (local_) {
    torch::serialize::InputArchive shard_archive;
    archive.read("shard", shard_archive);
    local_->load(shard_archive);
  }
}

}  // namespace trainkit::dist
