#include "trainkit/dist/fully_shard.h"

#include <algorithm>
#include <map>

#include <c10/core/StorageImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include "detail/check.h"
#include "trainkit/compat.h"
#include "trainkit/nn/activation_checkpoint.h"

namespace trainkit::dist {

namespace {

constexpr int64_t kFsdpVersion = 1;

at::Tensor read_tensor(torch::serialize::InputArchive& archive, const std::string& key) {
  at::Tensor t;
  TRAINKIT_CHECK_ARG(archive.try_read(key, t),
                     "FullyShardedDataParallel: the shard has no '{}' (not a FullyShardedDataParallel shard?)", key);
  return t;
}

std::vector<int64_t> read_int_list(torch::serialize::InputArchive& archive, const std::string& key) {
  const at::Tensor t = read_tensor(archive, key).to(at::kLong).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

}  // namespace

struct FullyShardedDataParallel::State {
  std::shared_ptr<torch::nn::Module> model;
  std::shared_ptr<ProcessGroup> group;
  FullyShardOptions options;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ZeroRedundancyOptimizer> zero;
  std::vector<at::Tensor> params;  // trainable, in model->parameters() order
  std::vector<std::string> names;
  std::vector<int64_t> owner;
  std::vector<size_t> full_bytes;   // each parameter's storage in full
  std::vector<std::string> unit_names;
  std::vector<std::vector<size_t>> unit_params;
  std::vector<std::vector<at::Tensor>> unit_buffers;
  std::vector<compat::AutogradNodePtr> accumulators;
  ShardReader reader;

  bool mine(size_t i) const { return owner[i] == group->rank(); }
  bool held(size_t i) const { return params[i].storage().nbytes() > 0; }

  /// Frees the storage of a parameter this rank does not own; its shape stays.
  void release(size_t i) {
    if (mine(i)) return;
    c10::StorageImpl* storage = params[i].storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(at::DataPtr(nullptr, params[i].device()));
    storage->set_nbytes(0);
  }

  /// Gives every parameter of `unit` its full value: storage for those this rank lacks, then one broadcast
  /// per owner (written through variable_data(): no version counter moves).
  void gather(size_t unit) {
    const int64_t world = group->world_size();
    std::vector<std::vector<at::Tensor>> by_owner(static_cast<size_t>(world));
    for (size_t i : unit_params[unit]) {
      if (!held(i)) {
        c10::StorageImpl* storage = params[i].storage().unsafeGetStorageImpl();
        c10::Allocator* allocator = storage->allocator();
        if (allocator == nullptr) allocator = c10::GetAllocator(params[i].device().type());
        storage->set_data_ptr_noswap(allocator->allocate(full_bytes[i]));
        storage->set_nbytes(full_bytes[i]);
      }
      by_owner[static_cast<size_t>(owner[i])].push_back(params[i].variable_data());
    }
    for (int64_t r = 0; r < world; ++r) {
      if (!by_owner[static_cast<size_t>(r)].empty()) group->broadcast_tensors(by_owner[static_cast<size_t>(r)], r);
    }
  }

  void release_unit(size_t unit) {
    for (size_t i : unit_params[unit]) release(i);
  }
};

namespace {

/// Runs after a parameter's AccumulateGrad (after the DDP's hook has taken its gradient): the unit's
/// backward is done with it, so a rank that does not own it frees it.
class ReleaseHook : public torch::autograd::FunctionPostHook {
 public:
  explicit ReleaseHook(std::function<void()> release) : release_(std::move(release)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    release_();
    return outputs;
  }

 private:
  std::function<void()> release_;
};

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> model,
                                                   const std::vector<std::string>& units,
                                                   std::shared_ptr<ProcessGroup> group, const OptimizerFactory& factory,
                                                   FullyShardOptions options)
    : FullyShardedDataParallel(
          model, units, group,
          [&] {
            TRAINKIT_CHECK_ARG(model, "FullyShardedDataParallel: model is null");
            TRAINKIT_CHECK_ARG(factory, "FullyShardedDataParallel: optimizer factory is empty");
            std::vector<at::Tensor> trainable;
            for (const auto& p : model->parameters()) {
              if (p.requires_grad()) trainable.push_back(p);
            }
            return std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(trainable)};
          }(),
          [factory](std::vector<torch::optim::OptimizerParamGroup> groups) {
            return factory(groups.empty() ? std::vector<at::Tensor>{} : groups.front().params());
          },
          std::move(options)) {}

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> model,
                                                   const std::vector<std::string>& units,
                                                   std::shared_ptr<ProcessGroup> group,
                                                   std::vector<torch::optim::OptimizerParamGroup> groups,
                                                   const GroupedOptimizerFactory& factory, FullyShardOptions options)
    : state_(std::make_shared<State>()) {
  TRAINKIT_CHECK_ARG(model, "FullyShardedDataParallel: model is null");
  TRAINKIT_CHECK_ARG(group, "FullyShardedDataParallel: process group is null");
  TRAINKIT_CHECK_ARG(!units.empty(), "FullyShardedDataParallel: no units named");
  auto& s = *state_;
  s.model = model;
  s.group = group;
  s.options = options;
  for (const auto& item : model->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    s.params.push_back(item.value());
    s.names.push_back(item.key());
  }
  std::map<const void*, size_t> index_of;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const auto& p = s.params[i];
    TRAINKIT_CHECK_ARG(p.is_contiguous() && p.storage_offset() == 0 && p.storage().nbytes() == p.nbytes(),
                       "FullyShardedDataParallel: parameter '{}' shares its storage with other tensors (stage 3 frees "
                       "each parameter's storage on the ranks that do not own it)",
                       s.names[i]);
    index_of[p.unsafeGetTensorImpl()] = i;
    s.full_bytes.push_back(p.storage().nbytes());
  }
  // The units, and which of them holds each parameter.
  const auto modules = model->named_modules("", /*include_self=*/false);
  std::vector<int64_t> unit_of(s.params.size(), -1);
  for (const auto& name : units) {
    const auto* found = modules.find(name);
    TRAINKIT_CHECK_ARG(found != nullptr, "FullyShardedDataParallel: the model has no submodule '{}' (its children: {})",
                       name, fmt::join(model->named_children().keys(), ", "));
    const auto u = s.unit_names.size();
    s.unit_names.push_back(name);
    s.unit_params.emplace_back();
    for (const auto& p : (*found)->parameters()) {
      const auto it = index_of.find(p.unsafeGetTensorImpl());
      if (it == index_of.end()) continue;  // frozen: kept in full everywhere
      auto& slot = unit_of[it->second];
      TRAINKIT_CHECK_ARG(slot < 0, "FullyShardedDataParallel: parameter '{}' is in units '{}' and '{}'",
                         s.names[it->second], slot < 0 ? "" : s.unit_names[static_cast<size_t>(slot)], name);
      slot = static_cast<int64_t>(u);
      s.unit_params.back().push_back(it->second);
    }
    s.unit_buffers.push_back((*found)->buffers());
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    TRAINKIT_CHECK_ARG(unit_of[i] >= 0,
                       "FullyShardedDataParallel: parameter '{}' is in no unit (name units that together hold every "
                       "trainable parameter)",
                       s.names[i]);
  }
  // Gradients to their owners: ZeRO-2's buckets over a DDP, with the optimizer's step not broadcasting.
  s.ddp = std::make_unique<DistributedDataParallel>(model, group, options.ddp());
  s.zero = std::make_unique<ZeroRedundancyOptimizer>(*s.ddp, std::move(groups), factory, ZeroOptions().stage(3));
  std::map<const void*, int64_t> owner_of;
  int64_t k = 0;
  for (const auto& g : s.zero->param_groups()) {
    for (const auto& p : g.params()) owner_of[p.unsafeGetTensorImpl()] = s.zero->owner(k++);
  }
  for (const auto& p : s.params) s.owner.push_back(owner_of.at(p.unsafeGetTensorImpl()));
  if (group->world_size() == 1) return;
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.mine(i)) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(s.params[i]);
    std::weak_ptr<State> weak = state_;
    accumulator->add_post_hook(std::make_unique<ReleaseHook>([weak, i] {
      if (auto state = weak.lock()) state->release(i);
    }));
    s.accumulators.push_back(std::move(accumulator));  // parameters hold them weakly
    s.release(i);
  }
}

FullyShardedDataParallel::~FullyShardedDataParallel() = default;

at::Tensor FullyShardedDataParallel::run(size_t unit, const std::function<at::Tensor(const at::Tensor&)>& fn,
                                         const at::Tensor& input) {
  auto& s = *state_;
  TRAINKIT_CHECK_ARG(unit < s.unit_names.size(), "FullyShardedDataParallel::run: unit {} of {}", unit,
                     s.unit_names.size());
  TRAINKIT_CHECK_ARG(static_cast<bool>(fn), "FullyShardedDataParallel::run: empty function");
  if (s.group->world_size() == 1 || s.unit_params[unit].empty()) return fn(input);  // nothing sharded to gather
  std::vector<at::Tensor> params;
  for (size_t i : s.unit_params[unit]) params.push_back(s.params[i]);
  // Without autograd (the checkpointed forward, or evaluation) nothing keeps the parameters: free them at
  // once. With it (the recomputation in backward) each is freed by its ReleaseHook once its gradient is in.
  std::weak_ptr<State> weak = state_;
  const auto gathered = [weak, unit, fn](const at::Tensor& x) {
    auto state = weak.lock();
    TRAINKIT_CHECK_ARG(state != nullptr, "FullyShardedDataParallel: a unit ran after its FullyShardedDataParallel died");
    state->gather(unit);
    at::Tensor out = fn(x);
    if (!torch::autograd::GradMode::is_enabled()) state->release_unit(unit);
    return out;
  };
  return nn::checkpoint(gathered, input,
                        nn::CheckpointOptions()
                            .parameters(std::move(params))
                            .buffers(s.unit_buffers[unit])
                            .preserve_rng_state(s.options.preserve_rng_state()));
}

size_t FullyShardedDataParallel::unit_index(const std::string& name) const {
  const auto& names = state_->unit_names;
  const auto it = std::find(names.begin(), names.end(), name);
  TRAINKIT_CHECK_ARG(it != names.end(), "FullyShardedDataParallel: no unit '{}' (units: {})", name,
                     fmt::join(names, ", "));
  return static_cast<size_t>(it - names.begin());
}

const std::vector<std::string>& FullyShardedDataParallel::unit_names() const { return state_->unit_names; }
ZeroRedundancyOptimizer& FullyShardedDataParallel::optimizer() { return *state_->zero; }
DistributedDataParallel& FullyShardedDataParallel::ddp() { return *state_->ddp; }
const std::shared_ptr<ProcessGroup>& FullyShardedDataParallel::process_group() const { return state_->group; }
int64_t FullyShardedDataParallel::owner(int64_t index) const { return state_->owner.at(static_cast<size_t>(index)); }

int64_t FullyShardedDataParallel::local_parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : state_->params) bytes += static_cast<int64_t>(p.storage().nbytes());
  return bytes;
}

int64_t FullyShardedDataParallel::largest_unit_bytes() const {
  int64_t largest = 0;
  for (const auto& unit : state_->unit_params) {
    int64_t bytes = 0;
    for (size_t i : unit) bytes += static_cast<int64_t>(state_->full_bytes[i]);
    largest = std::max(largest, bytes);
  }
  return largest;
}

int64_t FullyShardedDataParallel::gathered_units() const {
  const auto& s = *state_;
  int64_t n = 0;
  for (const auto& unit : s.unit_params) {
    n += std::any_of(unit.begin(), unit.end(), [&](size_t i) { return !s.mine(i) && s.held(i); }) ? 1 : 0;
  }
  return n;
}

torch::OrderedDict<std::string, at::Tensor> FullyShardedDataParallel::full_state_dict() {
  auto& s = *state_;
  const bool main = s.group->is_main();
  std::vector<at::Tensor> full(s.params.size());
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < s.unit_params.size(); ++u) {
    s.gather(u);
    for (size_t i : s.unit_params[u]) {
      if (main) full[i] = s.params[i].detach().clone();
    }
    s.release_unit(u);
  }
  torch::OrderedDict<std::string, at::Tensor> out;
  if (!main) return out;
  std::map<std::string, size_t> trainable;
  for (size_t i = 0; i < s.names.size(); ++i) trainable[s.names[i]] = i;
  for (const auto& item : s.model->named_parameters()) {
    const auto it = trainable.find(item.key());
    out.insert(item.key(), it != trainable.end() ? full[it->second] : item.value().detach().clone());
  }
  for (const auto& item : s.model->named_buffers()) out.insert(item.key(), item.value().detach().clone());
  return out;
}

void FullyShardedDataParallel::save(torch::serialize::OutputArchive& archive) const {
  save_model(archive);
  torch::serialize::OutputArchive optimizer;
  state_->zero->save(optimizer);
  archive.write("optimizer", optimizer);
}

void FullyShardedDataParallel::save_model(torch::serialize::OutputArchive& archive) const {
  const auto& s = *state_;
  std::vector<int64_t> numel;
  for (const auto& p : s.params) numel.push_back(p.numel());
  archive.write("fsdp_version", at::tensor(kFsdpVersion));
  archive.write("world_size", at::tensor(s.group->world_size()));
  archive.write("rank", at::tensor(s.group->rank()));
  archive.write("owner", at::tensor(s.owner));
  archive.write("numel", at::tensor(numel));
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.mine(i)) archive.write("param" + std::to_string(i), s.params[i].detach());
  }
  // Buffers and frozen parameters are the same on every rank: each shard holds them (small).
  size_t b = 0;
  for (const auto& buffer : s.model->buffers()) archive.write("buffer" + std::to_string(b++), buffer, true);
  size_t f = 0;
  for (const auto& p : s.model->parameters()) {
    if (!p.requires_grad()) archive.write("frozen" + std::to_string(f++), p.detach());
  }
}

void FullyShardedDataParallel::set_shard_reader(ShardReader reader) { state_->reader = std::move(reader); }

void FullyShardedDataParallel::load(torch::serialize::InputArchive& archive) {
  auto& s = *state_;
  load_model(archive);
  // A shard of another rank or world size: the optimizer's state comes from the other shards too.
  const bool resharded = read_tensor(archive, "world_size").item<int64_t>() != s.group->world_size() ||
                         read_tensor(archive, "rank").item<int64_t>() != s.group->rank();
  torch::serialize::InputArchive optimizer;
  archive.read("optimizer", optimizer);
  if (resharded && s.reader) s.zero->set_shard_reader(nested_shard_reader(s.reader, "optimizer"));
  s.zero->load(optimizer);
  s.zero->set_shard_reader(nullptr);
}

void FullyShardedDataParallel::load_model(torch::serialize::InputArchive& archive) {
  auto& s = *state_;
  const int64_t version = read_tensor(archive, "fsdp_version").item<int64_t>();
  TRAINKIT_CHECK_ARG(version == kFsdpVersion, "FullyShardedDataParallel: shard format version {} (this build reads {})",
                     version, kFsdpVersion);
  const int64_t world = read_tensor(archive, "world_size").item<int64_t>();
  const int64_t rank = read_tensor(archive, "rank").item<int64_t>();
  const auto saved_owner = read_int_list(archive, "owner");
  const auto numel = read_int_list(archive, "numel");
  TRAINKIT_CHECK_ARG(numel.size() == s.params.size(),
                     "FullyShardedDataParallel: the shard of rank {} of {} holds {} trainable parameters, this model {}",
                     rank, world, numel.size(), s.params.size());
  for (size_t i = 0; i < s.params.size(); ++i) {
    TRAINKIT_CHECK_ARG(numel[i] == s.params[i].numel(),
                       "FullyShardedDataParallel: parameter '{}' has {} elements in the shard of rank {} of {}, {} here",
                       s.names[i], numel[i], rank, world, s.params[i].numel());
  }
  const bool same = world == s.group->world_size() && rank == s.group->rank();
  // Every archive this rank needs: its parameters' previous owners.
  std::map<int64_t, std::unique_ptr<torch::serialize::InputArchive>> opened;
  const auto shard_of = [&](int64_t from) -> torch::serialize::InputArchive& {
    if (from == rank) return archive;
    auto& slot = opened[from];
    if (!slot) {
      TRAINKIT_CHECK_ARG(static_cast<bool>(s.reader),
                         "FullyShardedDataParallel: rank {} of {} loads the shard of rank {} of {} and needs the shard "
                         "of rank {} too: set_shard_reader()",
                         s.group->rank(), s.group->world_size(), rank, world, from);
      slot = s.reader(from, world);
      TRAINKIT_CHECK_ARG(slot != nullptr,
                         "FullyShardedDataParallel: rank {} of {} needs the shard of rank {} of the {}-rank run, which "
                         "the checkpoint does not hold",
                         s.group->rank(), s.group->world_size(), from, world);
    }
    return *slot;
  };
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (!s.mine(i)) continue;
    s.params[i].copy_(read_tensor(shard_of(same ? rank : saved_owner.at(i)), "param" + std::to_string(i)));
  }
  size_t b = 0;
  for (auto& buffer : s.model->buffers()) buffer.copy_(read_tensor(archive, "buffer" + std::to_string(b++)));
  size_t f = 0;
  for (auto& p : s.model->parameters()) {
    if (!p.requires_grad()) p.copy_(read_tensor(archive, "frozen" + std::to_string(f++)));
  }
}

std::vector<std::string> sequential_units(const torch::nn::Sequential& model) {
  std::vector<std::string> units;
  for (const auto& child : model->named_children()) {
    const auto params = child.value()->parameters();
    if (std::any_of(params.begin(), params.end(), [](const at::Tensor& p) { return p.requires_grad(); })) {
      units.push_back(child.key());
    }
  }
  return units;
}

at::Tensor forward_sequential(FullyShardedDataParallel& fsdp, const torch::nn::Sequential& model,
                              const at::Tensor& input) {
  const auto& names = fsdp.unit_names();
  const auto impl = model.ptr();  // the same modules, callable
  at::Tensor x = input;
  size_t i = 0;
  for (const auto& child : impl->named_children()) {
    auto& any = *(impl->begin() + static_cast<int64_t>(i++));
    const auto it = std::find(names.begin(), names.end(), child.key());
    if (it == names.end()) {
      x = any.forward(x);
      continue;
    }
    x = fsdp.run(static_cast<size_t>(it - names.begin()), [&any](const at::Tensor& in) { return any.forward(in); }, x);
  }
  return x;
}

}  // namespace trainkit::dist
