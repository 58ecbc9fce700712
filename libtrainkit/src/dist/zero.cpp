#include "trainkit/dist/zero.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <torch/torch.h>

#include "detail/check.h"
#include "trainkit/compat.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/grad/clip.h"
#include "trainkit/optim/lamb.h"
#include "trainkit/train/checkpoint.h"

namespace trainkit::dist {

namespace {

constexpr int64_t kShardVersion = 3;  // 3: several param groups ("group_sizes", "options/group<g>"); 2: one

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

int64_t read_int(torch::serialize::InputArchive& archive, const char* key) {
  at::Tensor t;
  TRAINKIT_CHECK_ARG(archive.try_read(key, t), "ZeroRedundancyOptimizer: the shard has no '{}' (not a ZeRO shard?)",
                     key);
  return t.item<int64_t>();
}

std::vector<int64_t> read_ints(torch::serialize::InputArchive& archive, const char* key) {
  at::Tensor t;
  TRAINKIT_CHECK_ARG(archive.try_read(key, t), "ZeroRedundancyOptimizer: the shard has no '{}' (not a ZeRO shard?)",
                     key);
  t = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

/// The metadata of one saved shard.
struct ShardInfo {
  int64_t version = 0;
  int64_t world = 0;
  int64_t rank = 0;
  std::vector<int64_t> owner;
  std::vector<int64_t> numel;
  std::vector<int64_t> group_sizes;
  torch::serialize::InputArchive* archive = nullptr;
};

ShardInfo read_info(torch::serialize::InputArchive& archive) {
  ShardInfo info;
  info.version = read_int(archive, "zero_version");
  TRAINKIT_CHECK_ARG(info.version == 2 || info.version == kShardVersion,
                     "ZeroRedundancyOptimizer: shard format version {} (this build reads 2 and {})", info.version,
                     kShardVersion);
  info.world = read_int(archive, "world_size");
  info.rank = read_int(archive, "rank");
  info.owner = read_ints(archive, "owner");
  info.numel = read_ints(archive, "numel");
  info.group_sizes = info.version == 2 ? std::vector<int64_t>{static_cast<int64_t>(info.owner.size())}
                                       : read_ints(archive, "group_sizes");
  info.archive = &archive;
  return info;
}

/// The saved options of param group `g` (version 2 shards hold one group's options directly).
void read_group_options(const ShardInfo& info, size_t g, torch::optim::OptimizerOptions& options) {
  torch::serialize::InputArchive all;
  info.archive->read("options", all);
  if (info.version == 2) {
    options.serialize(all);
    return;
  }
  torch::serialize::InputArchive one;
  all.read("group" + std::to_string(g), one);
  options.serialize(one);
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

struct ZeroRedundancyOptimizer::Partition {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<int64_t> owner;         // by parameter, group by group
  std::vector<int64_t> local_groups;  // the global group of each local group
  std::unique_ptr<torch::optim::Optimizer> local;
  GroupedOptimizerFactory factory;

  Partition(std::vector<torch::optim::OptimizerParamGroup> all, int64_t world, int64_t rank,
            const GroupedOptimizerFactory& make)
      : groups(std::move(all)), factory(make) {
    TRAINKIT_CHECK_ARG(factory, "ZeroRedundancyOptimizer: optimizer factory is empty");
    size_t total = 0;
    for (const auto& g : groups) total += g.params().size();
    TRAINKIT_CHECK_ARG(total > 0, "ZeroRedundancyOptimizer: no parameters");
    TRAINKIT_CHECK_ARG(static_cast<int64_t>(total) >= world,
                       "ZeroRedundancyOptimizer: {} parameter tensors cannot be shared by {} ranks (each rank must own "
                       "one at least)",
                       total, world);
    // PyTorch's partition: group by group, parameters by size, largest first, each to the rank with the
    // smallest total so far (totals carried over from group to group).
    std::vector<int64_t> load(static_cast<size_t>(world), 0);
    std::vector<int64_t> count(static_cast<size_t>(world), 0);
    owner.assign(total, 0);
    size_t offset = 0;
    for (const auto& group : groups) {
      const auto& params = group.params();
      std::vector<size_t> order(params.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
      for (size_t i : order) {
        const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        owner[offset + i] = static_cast<int64_t>(r);
        load[r] += params[i].numel();
        ++count[r];
      }
      offset += params.size();
    }
    const auto idle = std::find(count.begin(), count.end(), 0);
    TRAINKIT_CHECK_ARG(idle == count.end(),
                       "ZeroRedundancyOptimizer: rank {} of {} would own no parameter (empty tensors?)",
                       idle - count.begin(), world);
    local = factory(shard_groups(groups, owner, rank, &local_groups));
    TRAINKIT_CHECK_ARG(local, "ZeroRedundancyOptimizer: the factory returned no optimizer");
    TRAINKIT_CHECK_ARG(local->param_groups().size() == local_groups.size(),
                       "ZeroRedundancyOptimizer: the factory's optimizer has {} param groups; it must make one of each "
                       "group it is given ({})",
                       local->param_groups().size(), local_groups.size());
    if (world > 1) {
      for (const auto& group : local->param_groups()) {
        const auto* lamb = dynamic_cast<const optim::LambOptions*>(&group.options());
        TRAINKIT_CHECK_ARG(lamb == nullptr || lamb->max_grad_norm().value_or(0.0) == 0,
                           "ZeroRedundancyOptimizer: Lamb's max_grad_norm = {} would clip by the norm of this rank's "
                           "shard only; set it to none and clip with ZeroRedundancyOptimizer::clip_grad_norm_ (the "
                           "norm over all ranks)",
                           lamb != nullptr ? lamb->max_grad_norm().value_or(0.0) : 0.0);
      }
    }
    // A group given without options (the one group of the parameter-list constructors) gets the options the
    // factory gave it.
    for (size_t j = 0; j < local_groups.size(); ++j) {
      auto& g = groups[static_cast<size_t>(local_groups[j])];
      if (!g.has_options()) g.set_options(local->param_groups()[j].options().clone());
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      TRAINKIT_CHECK_ARG(groups[g].has_options(),
                         "ZeroRedundancyOptimizer: param group {} has no options (give every group its options)", g);
    }
  }

  /// The groups that hold a parameter owned by `rank` (each with those parameters and its options), and in
  /// `which` the global index of each.
  static std::vector<torch::optim::OptimizerParamGroup> shard_groups(
      const std::vector<torch::optim::OptimizerParamGroup>& groups, const std::vector<int64_t>& owner, int64_t rank,
      std::vector<int64_t>* which) {
    std::vector<torch::optim::OptimizerParamGroup> out;
    size_t offset = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<at::Tensor> mine;
      for (size_t i = 0; i < groups[g].params().size(); ++i) {
        if (owner[offset + i] == rank) mine.push_back(groups[g].params()[i]);
      }
      offset += groups[g].params().size();
      if (mine.empty()) continue;
      out.emplace_back(std::move(mine), groups[g].has_options() ? groups[g].options().clone() : nullptr);
      if (which != nullptr) which->push_back(static_cast<int64_t>(g));
    }
    return out;
  }
};

namespace {

/// The factory of the parameter-list constructors, over the one group.
GroupedOptimizerFactory one_group(const OptimizerFactory& factory) {
  TRAINKIT_CHECK_ARG(factory, "ZeroRedundancyOptimizer: optimizer factory is empty");
  return [factory](std::vector<torch::optim::OptimizerParamGroup> groups) {
    return factory(groups.empty() ? std::vector<at::Tensor>{} : groups.front().params());
  };
}

std::vector<at::Tensor> trainable(const DistributedDataParallel& ddp) {
  std::vector<at::Tensor> params;
  for (const auto& p : ddp.module()->parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  return params;
}

/// Checks that `groups` hold each trainable parameter of `ddp` exactly once and nothing else.
void check_covers(const DistributedDataParallel& ddp, const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  std::map<const void*, std::string> names;
  for (const auto& item : ddp.module()->named_parameters()) {
    if (item.value().requires_grad()) names[item.value().unsafeGetTensorImpl()] = item.key();
  }
  std::map<const void*, size_t> seen;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g].params()) {
      const void* key = p.unsafeGetTensorImpl();
      TRAINKIT_CHECK_ARG(names.count(key) != 0,
                         "ZeroRedundancyOptimizer: param group {} holds a tensor that is not a trainable parameter "
                         "of the DistributedDataParallel's module",
                         g);
      const auto [it, fresh] = seen.emplace(key, g);
      TRAINKIT_CHECK_ARG(fresh, "ZeroRedundancyOptimizer: parameter '{}' is in param groups {} and {}", names[key],
                         it->second, g);
    }
  }
  for (const auto& [key, name] : names) {
    TRAINKIT_CHECK_ARG(seen.count(key) != 0, "ZeroRedundancyOptimizer: parameter '{}' is in no param group", name);
  }
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(Partition partition, std::shared_ptr<ProcessGroup> group,
                                                 ZeroOptions options)
    : torch::optim::Optimizer(partition.groups, partition.groups.front().options().clone()),
      group_(std::move(group)),
      options_(options),
      factory_(std::move(partition.factory)),
      owner_(std::move(partition.owner)),
      local_groups_(std::move(partition.local_groups)),
      local_(std::move(partition.local)) {
  // LibTorch's Optimizer keeps a group's own options only for its own optimizer types (2.9+): put back each
  // group's (layer-wise LRs, no weight decay for 1-d tensors), as optim::OptimizerBase does.
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].set_options(partition.groups[g].options().clone());
  }
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group,
                                                 const OptimizerFactory& factory, ZeroOptions options)
    : ZeroRedundancyOptimizer({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(group),
                              one_group(factory), options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 const GroupedOptimizerFactory& factory, ZeroOptions options)
    : ZeroRedundancyOptimizer(
          [&] {
            TRAINKIT_CHECK_ARG(group, "ZeroRedundancyOptimizer: process group is null");
            TRAINKIT_CHECK_ARG(options.stage() == 1,
                               "ZeroRedundancyOptimizer: stage {} over a parameter list (stage 2 needs the "
                               "DistributedDataParallel constructor, which owns the gradient hooks)",
                               options.stage());
            return Partition(std::move(groups), group->world_size(), group->rank(), factory);
          }(),
          group, options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(DistributedDataParallel& ddp, const OptimizerFactory& factory,
                                                 ZeroOptions options)
    : ZeroRedundancyOptimizer(ddp, {torch::optim::OptimizerParamGroup(trainable(ddp))}, one_group(factory), options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(DistributedDataParallel& ddp,
                                                 std::vector<torch::optim::OptimizerParamGroup> groups,
                                                 const GroupedOptimizerFactory& factory, ZeroOptions options)
    : ZeroRedundancyOptimizer(
          [&] {
            TRAINKIT_CHECK_ARG(options.stage() >= 1 && options.stage() <= 3,
                               "ZeroRedundancyOptimizer: invalid stage {} (1, 2, or 3 through "
                               "FullyShardedDataParallel)",
                               options.stage());
            check_covers(ddp, groups);
            const auto& group = ddp.process_group();
            return Partition(std::move(groups), group->world_size(), group->rank(), factory);
          }(),
          ddp.process_group(), options) {
  if (options_.stage() >= 2) {
    // The DDP's buckets go by its own parameter order: each parameter's owner there.
    std::map<const void*, int64_t> owner_of;
    const auto params = all_params();
    for (size_t i = 0; i < params.size(); ++i) owner_of[params[i].unsafeGetTensorImpl()] = owner_[i];
    std::vector<int64_t> ddp_owner;
    for (const auto& p : trainable(ddp)) ddp_owner.push_back(owner_of.at(p.unsafeGetTensorImpl()));
    ddp.reduce_to_owners(ddp_owner);
  }
}

std::vector<at::Tensor> ZeroRedundancyOptimizer::all_params() const {
  std::vector<at::Tensor> out;
  for (const auto& g : param_groups_) out.insert(out.end(), g.params().begin(), g.params().end());
  return out;
}

std::vector<int64_t> ZeroRedundancyOptimizer::group_sizes() const {
  std::vector<int64_t> out;
  for (const auto& g : param_groups_) out.push_back(static_cast<int64_t>(g.params().size()));
  return out;
}

std::vector<int64_t> ZeroRedundancyOptimizer::shard(int64_t rank) const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < owner_.size(); ++i) {
    if (owner_[i] == rank) out.push_back(static_cast<int64_t>(i));
  }
  return out;
}

at::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable(true);
    loss = closure();
  }
  // A scheduler sets this object's options: the shard's optimizer steps with them (Python's ZeRO syncs the
  // param groups the same way).
  for (size_t j = 0; j < local_groups_.size(); ++j) {
    local_->param_groups()[j].set_options(param_groups_[static_cast<size_t>(local_groups_[j])].options().clone());
  }
  local_->step();
  // Stage 3: the other ranks hold no copy to update; FullyShardedDataParallel gathers from the owners.
  const auto params = all_params();
  for (int64_t r = 0; r < group_->world_size() && group_->world_size() > 1 && options_.stage() < 3; ++r) {
    std::vector<at::Tensor> owned;
    for (size_t i = 0; i < params.size(); ++i) {
      if (owner_[i] == r) owned.push_back(params[i]);
    }
    group_->broadcast_tensors(owned, r);
  }
  return loss;
}

at::Tensor ZeroRedundancyOptimizer::clip_grad_norm_(double max_norm, double norm_type) {
  TRAINKIT_CHECK_ARG(max_norm >= 0, "ZeroRedundancyOptimizer::clip_grad_norm_: invalid max_norm {}", max_norm);
  TRAINKIT_CHECK_ARG(norm_type > 0, "ZeroRedundancyOptimizer::clip_grad_norm_: invalid norm_type {}", norm_type);
  const auto params = all_params();
  if (options_.stage() == 1 || group_->world_size() == 1) {
    return grad::clip_grad_norm_(params, max_norm, norm_type);
  }
  // Stage 2: every gradient lives on its owner only; the local norm covers this rank's shard. It is reduced
  // where the parameters live (through the group's backend for their device): a copy to the host would wait
  // for the device every step. A rank without gradients gets a CPU zero from grad_norm; it moves to the
  // parameters' device too, so that every rank reduces through the same backend.
  const bool inf = std::isinf(norm_type);
  const at::Tensor local = grad::grad_norm(params, norm_type).to(params.front().device(), at::kDouble);
  at::Tensor total = (inf ? local : local.pow(norm_type)).reshape({1}).contiguous();
  group_->all_reduce(total, inf ? ReduceOp::MAX : ReduceOp::SUM).wait();
  total = (inf ? total : total.pow(1.0 / norm_type)).reshape({});
  grad::clip_grads_with_norm_(params, max_norm, total);
  return total;
}

std::function<void(at::Tensor&)> ZeroRedundancyOptimizer::found_inf_reducer() const {
  // The flag stays on its device (the GradScaler's): reduced through the backend of that device.
  return [group = group_](at::Tensor& found_inf) {
    at::Tensor flag = found_inf.reshape({1}).to(at::kFloat).contiguous();
    group->all_reduce(flag).wait();
    found_inf.copy_(flag.reshape(found_inf.sizes()));
  };
}

int64_t ZeroRedundancyOptimizer::local_state_bytes() const { return optimizer_state_bytes(*local_); }

int64_t ZeroRedundancyOptimizer::local_gradient_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : all_params()) {
    if (p.grad().defined()) bytes += static_cast<int64_t>(p.grad().nbytes());
  }
  return bytes;
}

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  std::vector<int64_t> numel;
  for (const auto& p : all_params()) numel.push_back(p.numel());
  archive.write("zero_version", at::tensor(kShardVersion));
  archive.write("stage", at::tensor(options_.stage()));
  archive.write("world_size", at::tensor(group_->world_size()));
  archive.write("rank", at::tensor(group_->rank()));
  archive.write("owner", at::tensor(owner_));
  archive.write("numel", at::tensor(numel));
  archive.write("group_sizes", at::tensor(group_sizes()));
  archive.write("indices", at::tensor(shard(group_->rank())));
  torch::serialize::OutputArchive options_archive;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    torch::serialize::OutputArchive one;
    param_groups_[g].options().serialize(one);
    options_archive.write("group" + std::to_string(g), one);
  }
  archive.write("options", options_archive);
  torch::serialize::OutputArchive shard_archive;
  local_->save(shard_archive);
  archive.write("shard", shard_archive);
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  const ShardInfo info = read_info(archive);
  if ((info.world == group_->world_size() && info.rank == group_->rank()) || !shard_reader_) {
    load_shards({&archive});
    return;
  }
  load_with(archive, shard_reader_);
}

void ZeroRedundancyOptimizer::load_with(torch::serialize::InputArchive& first, const ShardReader& read) {
  const ShardInfo info = read_info(first);
  const auto& saved_owner = info.owner;
  std::map<int64_t, std::unique_ptr<torch::serialize::InputArchive>> opened;
  std::vector<torch::serialize::InputArchive*> needed{&first};
  for (int64_t i : shard(group_->rank())) {
    TRAINKIT_CHECK_ARG(static_cast<size_t>(i) < saved_owner.size(),
                       "ZeroRedundancyOptimizer: the checkpoint holds a partition of {} parameters, this model has {}",
                       saved_owner.size(), owner_.size());
    const int64_t from = saved_owner[static_cast<size_t>(i)];
    if (from == info.rank || opened.count(from) != 0) continue;
    auto archive = read(from, info.world);
    TRAINKIT_CHECK_ARG(archive != nullptr,
                       "ZeroRedundancyOptimizer: rank {} of {} needs the shard of rank {} of the {}-rank run, which "
                       "the checkpoint does not hold",
                       group_->rank(), group_->world_size(), from, info.world);
    needed.push_back(archive.get());
    opened[from] = std::move(archive);
  }
  load_shards(needed);
}

void ZeroRedundancyOptimizer::load_shards(const std::vector<torch::serialize::InputArchive*>& shards) {
  TRAINKIT_CHECK_ARG(!shards.empty(), "ZeroRedundancyOptimizer::load_shards: no shard given");
  const auto params = all_params();
  const auto sizes = group_sizes();
  std::map<int64_t, ShardInfo> by_rank;
  int64_t world = -1;
  for (auto* archive : shards) {
    ShardInfo info = read_info(*archive);
    if (world < 0) world = info.world;
    TRAINKIT_CHECK_ARG(info.world == world,
                       "ZeroRedundancyOptimizer: shards of runs with {} and {} ranks given together", world, info.world);
    TRAINKIT_CHECK_ARG(info.owner.size() == params.size() && info.numel.size() == params.size(),
                       "ZeroRedundancyOptimizer: the shard of rank {} of {} holds a partition of {} parameters, this "
                       "model has {}",
                       info.rank, info.world, info.owner.size(), params.size());
    TRAINKIT_CHECK_ARG(info.group_sizes == sizes,
                       "ZeroRedundancyOptimizer: the shard of rank {} of {} holds param groups of {} parameters, this "
                       "optimizer's have {}",
                       info.rank, info.world, fmt::join(info.group_sizes, "/"), fmt::join(sizes, "/"));
    for (size_t i = 0; i < params.size(); ++i) {
      TRAINKIT_CHECK_ARG(info.numel[i] == params[i].numel(),
                         "ZeroRedundancyOptimizer: parameter {} has {} elements in the shard of rank {} of {}, {} here",
                         i, info.numel[i], info.rank, info.world, params[i].numel());
    }
    by_rank[info.rank] = std::move(info);
  }
  const auto& reference = by_rank.begin()->second;
  for (const auto& [r, info] : by_rank) {
    TRAINKIT_CHECK_ARG(info.owner == reference.owner,
                       "ZeroRedundancyOptimizer: the shards of ranks {} and {} disagree on the partition",
                       reference.rank, r);
  }
  // The saved shards this rank's parameters come from, each loaded into a fresh optimizer of the factory
  // over copies of that shard's parameters, in that shard's groups (which gives the optimizer's own
  // ParamState types).
  const auto mine = shard(group_->rank());
  std::map<int64_t, std::unique_ptr<torch::optim::Optimizer>> sources;
  std::map<int64_t, std::vector<at::Tensor>> source_params;
  for (int64_t i : mine) {
    const int64_t from = reference.owner[static_cast<size_t>(i)];
    if (sources.count(from) != 0) continue;
    const auto it = by_rank.find(from);
    TRAINKIT_CHECK_ARG(it != by_rank.end(),
                       "ZeroRedundancyOptimizer: rank {} of {} needs the shard of rank {} of the {}-rank run that saved "
                       "this state (it owned parameter {}); {}",
                       group_->rank(), group_->world_size(), from, world, i,
                       world == group_->world_size() ? "the partition differs" : "load it with load_shards");
    std::vector<torch::optim::OptimizerParamGroup> copies;
    for (const auto& g : param_groups_) {
      std::vector<at::Tensor> c;
      // Stand-ins that only key the state (stage 3's parameters have no storage on their non-owners).
      for (const auto& p : g.params()) c.push_back(at::empty_like(p));
      copies.emplace_back(std::move(c), g.options().clone());
    }
    auto source_groups = Partition::shard_groups(copies, reference.owner, from, nullptr);
    std::vector<at::Tensor> flat;
    for (const auto& g : source_groups) flat.insert(flat.end(), g.params().begin(), g.params().end());
    auto optimizer = factory_(std::move(source_groups));
    torch::serialize::InputArchive shard_archive;
    it->second.archive->read("shard", shard_archive);
    optimizer->load(shard_archive);
    sources[from] = std::move(optimizer);
    source_params[from] = std::move(flat);
  }
  // Every group's options as saved (what a scheduler had set).
  for (size_t g = 0; g < param_groups_.size(); ++g) read_group_options(reference, g, param_groups_[g].options());
  // The first source becomes the shard's optimizer: it keeps what its type saves besides the per-parameter
  // state (e.g. LAMB's step count), which every rank's shard holds alike. Its param groups become this
  // rank's and every parameter's state moves to its new key.
  const int64_t first_source = sources.begin()->first;
  auto local = std::move(sources.begin()->second);
  sources.erase(sources.begin());
  std::remove_reference_t<decltype(local->state())> moved;
  for (int64_t i : mine) {
    const int64_t from = reference.owner[static_cast<size_t>(i)];
    int64_t position = 0;
    for (int64_t j = 0; j < i; ++j) position += reference.owner[static_cast<size_t>(j)] == from ? 1 : 0;
    auto& holder = from == first_source ? *local : *sources.at(from);
    const auto& copy = source_params.at(from)[static_cast<size_t>(position)];
    auto found = holder.state().find(compat::param_state_key(copy));
    if (found != holder.state().end()) {
      moved.emplace(compat::param_state_key(params[static_cast<size_t>(i)]), found->second->clone());
    }
  }
  local->param_groups() = Partition::shard_groups(param_groups_, owner_, group_->rank(), nullptr);
  local->state() = std::move(moved);
  local_ = std::move(local);
}

std::string ZeroRedundancyOptimizer::shard_file_name(int64_t rank, int64_t world_size) {
  return "zero_shard_" + std::to_string(rank) + "_of_" + std::to_string(world_size) + ".pt";
}

void ZeroRedundancyOptimizer::save_sharded(const std::string& dir) const {
  std::filesystem::create_directories(dir);
  torch::serialize::OutputArchive archive;
  save(archive);
  train::save_checkpoint((std::filesystem::path(dir) / shard_file_name(group_->rank(), group_->world_size())).string(),
                         archive);
}

void ZeroRedundancyOptimizer::load_sharded(const std::string& dir) {
  // The world size that wrote the directory, from the file names.
  int64_t world = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const auto of = name.find("_of_");
    if (name.rfind("zero_shard_", 0) != 0 || of == std::string::npos) continue;
    const int64_t w = std::stoll(name.substr(of + 4));
    TRAINKIT_CHECK_ARG(world == 0 || world == w, "ZeroRedundancyOptimizer: {} holds the shards of runs with {} and {} "
                       "ranks; keep one run's shards per directory", dir, world, w);
    world = w;
  }
  TRAINKIT_CHECK_ARG(!ec, "ZeroRedundancyOptimizer: cannot read the shard directory {}: {}", dir, ec.message());
  TRAINKIT_CHECK_ARG(world > 0, "ZeroRedundancyOptimizer: {} holds no zero_shard_<rank>_of_<world>.pt file", dir);
  const ShardReader read = [&](int64_t r, int64_t w) {
    const std::string path = (std::filesystem::path(dir) / shard_file_name(r, w)).string();
    TRAINKIT_CHECK_ARG(std::filesystem::exists(path),
                       "ZeroRedundancyOptimizer: rank {} of {} needs {} (the shard of rank {} of the {}-rank run), "
                       "which does not exist",
                       group_->rank(), group_->world_size(), path, r, w);
    auto archive = std::make_unique<torch::serialize::InputArchive>();
    train::load_checkpoint(path, *archive);
    return archive;
  };
  auto first = read(0, world);
  load_with(*first, read);
}

ShardReader nested_shard_reader(ShardReader whole, std::string part) {
  return [whole = std::move(whole), part = std::move(part)](int64_t rank, int64_t world_size)
             -> std::unique_ptr<torch::serialize::InputArchive> {
    auto archive = whole(rank, world_size);
    if (!archive) return nullptr;
    auto nested = std::make_unique<torch::serialize::InputArchive>();
    archive->read(part, *nested);
    return nested;
  };
}

}  // namespace trainkit::dist
