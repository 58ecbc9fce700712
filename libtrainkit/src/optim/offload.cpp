#include "trainkit/optim/offload.h"

#include <map>
#include <sstream>
#include <utility>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "detail/check.h"
#include "trainkit/compat.h"
#include "trainkit/optim/optimizer_base.h"

namespace trainkit::optim {

/// One parameter: where it is in the param groups, its host master and buffers.
struct OffloadOptimizer::Slot {
  /// Checks parameter `p` (parameter `index` of param group `group`) and makes its host buffers.
  Slot(const at::Tensor& p, size_t group, size_t index, const OffloadOptions& options);

  size_t group = 0;
  size_t index = 0;
  const void* device_impl = nullptr;  // the tensor the master was made for (a reshard swaps it)
  at::Tensor master;                  // host, float32 for bfloat16/float16 parameters; its grad is the buffer
  at::Tensor grad;                    // host gradient buffer in the master's dtype
  at::Tensor staging;                 // host buffer in the parameter's dtype when it differs from the master's
  bool stale = true;                  // read the master from the device at the next step
  bool stepped = false;               // had a gradient in this step
};

struct OffloadOptimizer::Built {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::unique_ptr<torch::optim::Optimizer> inner;
  std::vector<Slot> slots;
  c10::Device device = c10::kCPU;
};

namespace {

std::string where(size_t group, size_t index) { return fmt::format("parameter {} of param group {}", index, group); }

std::string shape(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

bool pinned(const OffloadOptions& options, const c10::Device& device) {
  return options.pin_memory().value_or(device.is_cuda());
}

/// Whether every tensor of `archive` (nested archives too) is on the CPU.
bool all_on_cpu(torch::serialize::InputArchive& archive) {
  for (const auto& key : archive.keys()) {
    at::Tensor t;
    if (archive.try_read(key, t)) {
      if (t.defined() && !t.device().is_cpu()) return false;
      continue;
    }
    torch::serialize::InputArchive nested;
    if (archive.try_read(key, nested) && !all_on_cpu(nested)) return false;
  }
  return true;
}

/// Waits for the copies queued on `device`'s current stream (non_blocking copies to or from pinned memory).
void synchronize(const c10::Device& device) {
  if (device.is_cpu()) return;
  const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  impl->synchronizeStream(impl->getStream(device));
}

}  // namespace

OffloadOptimizer::Slot::Slot(const at::Tensor& p, size_t group, size_t index, const OffloadOptions& options)
    : group(group), index(index) {
  TRAINKIT_CHECK_ARG(p.defined(), "OffloadOptimizer: {} is an undefined tensor", where(group, index));
  TRAINKIT_CHECK_ARG(p.layout() == at::kStrided, "OffloadOptimizer: {} (shape {}) is sparse; offload takes dense "
                     "parameters", where(group, index), shape(p));
  TRAINKIT_CHECK_ARG(at::isFloatingType(p.scalar_type()), "OffloadOptimizer: {} (shape {}) has dtype {}; offload "
                     "takes floating parameters", where(group, index), shape(p), c10::toString(p.scalar_type()));
  device_impl = p.unsafeGetTensorImpl();
  const auto master_dtype = internal::state_dtype(p.scalar_type());
  const auto host = at::TensorOptions().device(c10::kCPU).pinned_memory(pinned(options, p.device()));
  // Zeros until the first step reads the device's values: a factory may look at shapes, never at values
  // that the caller can still change before that step.
  master = at::zeros(p.sizes(), host.dtype(master_dtype));
  grad = at::zeros(p.sizes(), host.dtype(master_dtype));
  if (master_dtype != p.scalar_type()) staging = at::empty(p.sizes(), host.dtype(p.scalar_type()));
}

OffloadOptimizer::Built OffloadOptimizer::build(std::vector<torch::optim::OptimizerParamGroup> groups,
                                                const HostOptimizerFactory& factory, const OffloadOptions& options) {
  TRAINKIT_CHECK_ARG(factory, "OffloadOptimizer: the host optimizer factory is empty");
  Built built;
  std::optional<c10::Device> device;
  std::string first;
  std::vector<torch::optim::OptimizerParamGroup> host_groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<at::Tensor> masters;
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const at::Tensor& p = groups[g].params()[i];
      if (!device) {
        device = p.device();
        first = where(g, i);
      }
      Slot slot(p, g, i, options);
      TRAINKIT_CHECK_ARG(p.device() == *device, "OffloadOptimizer: {} (shape {}) is on {}, {} on {}; every parameter "
                         "must live on one device", where(g, i), shape(p), p.device().str(), first, device->str());
      masters.push_back(slot.master);
      built.slots.push_back(std::move(slot));
    }
    host_groups.emplace_back(std::move(masters), groups[g].has_options() ? groups[g].options().clone() : nullptr);
  }
  built.device = device.value_or(c10::Device(c10::kCPU));
  built.inner = factory(std::move(host_groups));
  TRAINKIT_CHECK_ARG(built.inner, "OffloadOptimizer: the factory returned no optimizer");
  const auto& inner_groups = built.inner->param_groups();
  TRAINKIT_CHECK_ARG(inner_groups.size() == groups.size(), "OffloadOptimizer: the factory's optimizer has {} param "
                     "groups; it must make one of each group it is given ({})", inner_groups.size(), groups.size());
  size_t k = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = inner_groups[g].params();
    TRAINKIT_CHECK_ARG(params.size() == groups[g].params().size(), "OffloadOptimizer: the factory's param group {} holds "
                       "{} tensors, it was given {}", g, params.size(), groups[g].params().size());
    for (size_t i = 0; i < params.size(); ++i, ++k) {
      TRAINKIT_CHECK_ARG(params[i].unsafeGetTensorImpl() == built.slots[k].master.unsafeGetTensorImpl(),
                         "OffloadOptimizer: the factory's optimizer holds another tensor (shape {}) in place of the "
                         "host master of {} (shape {}); it must step the tensors it is given",
                         shape(params[i]), where(g, i), shape(groups[g].params()[i]));
    }
    // The device group gets the options the host optimizer has (its defaults where none were given).
    groups[g].set_options(inner_groups[g].options().clone());
  }
  built.groups = std::move(groups);
  return built;
}

OffloadOptimizer::OffloadOptimizer(Built built, OffloadOptions options)
    : torch::optim::Optimizer(built.groups, built.groups.empty()
                                                ? std::make_unique<torch::optim::SGDOptions>(0.0)
                                                : built.groups.front().options().clone()),
      options_(options),
      device_(built.device),
      inner_(std::move(built.inner)),
      slots_(std::move(built.slots)) {
  internal::restore_group_options(*this, built.groups);
}

OffloadOptimizer::OffloadOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                   const HostOptimizerFactory& factory, OffloadOptions options)
    : OffloadOptimizer(build(std::move(groups), factory, options), options) {}

OffloadOptimizer::OffloadOptimizer(std::vector<at::Tensor> params, const HostOptimizerListFactory& factory,
                                   OffloadOptions options)
    : OffloadOptimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                       [&factory](std::vector<torch::optim::OptimizerParamGroup> groups) {
                         TRAINKIT_CHECK_ARG(factory, "OffloadOptimizer: the host optimizer factory is empty");
                         return factory(groups.front().params());
                       },
                       options) {}

OffloadOptimizer::~OffloadOptimizer() = default;

const at::Tensor& OffloadOptimizer::master(size_t group, size_t index) const {
  for (const auto& s : slots_) {
    if (s.group == group && s.index == index) return s.master;
  }
  throw std::invalid_argument(fmt::format("OffloadOptimizer::master: there is no {}", where(group, index)));
}

int64_t OffloadOptimizer::host_buffer_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : slots_) {
    bytes += static_cast<int64_t>(s.master.nbytes() + s.grad.nbytes());
    if (s.staging.defined()) bytes += static_cast<int64_t>(s.staging.nbytes());
  }
  return bytes;
}

void OffloadOptimizer::reload_parameters() {
  for (auto& s : slots_) s.stale = true;
}

void OffloadOptimizer::sync_slots() {
  bool same = param_groups_.size() == inner_->param_groups().size();
  size_t k = 0;
  for (size_t g = 0; same && g < param_groups_.size(); ++g) {
    same = param_groups_[g].params().size() == inner_->param_groups()[g].params().size();
    k += param_groups_[g].params().size();
  }
  if (same && k == slots_.size()) {
    for (auto& s : slots_) {
      const at::Tensor& p = param_groups_[s.group].params()[s.index];
      if (p.unsafeGetTensorImpl() == s.device_impl) continue;
      // Another tensor in the slot: the master takes its values at this step.
      TRAINKIT_CHECK_ARG(p.sizes() == s.master.sizes() && p.device() == device_ &&
                             internal::state_dtype(p.scalar_type()) == s.master.scalar_type(),
                         "OffloadOptimizer: {} is now a tensor of shape {} on {}, its host master has shape {} (for {})",
                         where(s.group, s.index), shape(p), p.device().str(), shape(s.master), device_.str());
      s.device_impl = p.unsafeGetTensorImpl();
      s.stale = true;
    }
    return;
  }
  // The param groups were replaced or added to (ZeroRedundancyOptimizer's resharding moves an optimizer loaded
  // from another rank's shard onto this rank's parameters): a slot per parameter, kept where the tensor had one,
  // and the host optimizer's groups over the masters, with each group's options.
  std::map<const void*, Slot> kept;
  for (auto& s : slots_) kept.emplace(s.device_impl, std::move(s));
  std::vector<Slot> slots;
  std::vector<torch::optim::OptimizerParamGroup> host_groups;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    std::vector<at::Tensor> masters;
    for (size_t i = 0; i < param_groups_[g].params().size(); ++i) {
      const at::Tensor& p = param_groups_[g].params()[i];
      TRAINKIT_CHECK_ARG(p.device() == device_, "OffloadOptimizer: {} (shape {}) is on {}, this optimizer's "
                         "parameters on {}", where(g, i), shape(p), p.device().str(), device_.str());
      const auto it = kept.find(p.unsafeGetTensorImpl());
      if (it != kept.end() && it->second.master.sizes() == p.sizes()) {
        slots.push_back(std::move(it->second));
        kept.erase(it);
        slots.back().group = g;
        slots.back().index = i;
      } else {
        slots.emplace_back(p, g, i, options_);
      }
      masters.push_back(slots.back().master);
    }
    host_groups.emplace_back(std::move(masters), param_groups_[g].options().clone());
  }
  inner_->param_groups() = std::move(host_groups);
  slots_ = std::move(slots);
}

void OffloadOptimizer::forward_options() const {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    inner_->param_groups()[g].set_options(param_groups_[g].options().clone());
  }
}

void OffloadOptimizer::lend_state() {
  auto& inner_state = inner_->state();
  for (const auto& s : slots_) {
    auto it = state_.find(compat::param_state_key(param_groups_[s.group].params()[s.index]));
    if (it == state_.end()) continue;
    inner_state[compat::param_state_key(s.master)] = std::move(it->second);
    state_.erase(it);
  }
}

void OffloadOptimizer::take_state() {
  auto& inner_state = inner_->state();
  for (const auto& s : slots_) {
    auto it = inner_state.find(compat::param_state_key(s.master));
    if (it == inner_state.end()) continue;
    state_[compat::param_state_key(param_groups_[s.group].params()[s.index])] = std::move(it->second);
    inner_state.erase(it);
  }
}

at::Tensor OffloadOptimizer::step(LossClosure closure) {
  at::Tensor loss = internal::run_closure(closure);
  at::NoGradGuard no_grad;
  sync_slots();
  // Down: the stale masters, then each gradient once, all queued before one wait.
  for (auto& s : slots_) {
    const at::Tensor& p = param_groups_[s.group].params()[s.index];
    if (s.stale) s.master.copy_(p.detach(), /*non_blocking=*/true);
    const at::Tensor& g = p.grad();
    s.stepped = g.defined();
    if (!s.stepped) continue;
    TRAINKIT_CHECK_ARG(g.layout() == at::kStrided, "OffloadOptimizer: {} (shape {}) has a sparse gradient, which "
                       "offload does not take", where(s.group, s.index), shape(p));
    (s.staging.defined() ? s.staging : s.grad).copy_(g, /*non_blocking=*/true);
  }
  synchronize(device_);
  for (auto& s : slots_) {
    s.stale = false;
    if (s.stepped && s.staging.defined()) s.grad.copy_(s.staging);
    s.master.mutable_grad() = s.stepped ? s.grad : at::Tensor();
  }
  // The step on the host, with the options a scheduler set on this object and the state kept here.
  forward_options();
  lend_state();
  try {
    inner_->step();
  } catch (...) {
    take_state();
    throw;
  }
  take_state();
  // Up: each stepped parameter once, in its own dtype.
  for (auto& s : slots_) {
    if (!s.stepped) continue;
    at::Tensor p = param_groups_[s.group].params()[s.index].detach();
    if (s.staging.defined()) {
      s.staging.copy_(s.master);
      p.copy_(s.staging, /*non_blocking=*/true);
    } else {
      p.copy_(s.master, /*non_blocking=*/true);
    }
  }
  return loss;
}

void OffloadOptimizer::save(torch::serialize::OutputArchive& archive) const {
  // The host groups follow param groups replaced or added since the last step (only host buffers change).
  const_cast<OffloadOptimizer&>(*this).sync_slots();
  // The inner optimizer saves shallow copies of the state (the tensors are shared, nothing is copied).
  forward_options();
  auto& inner_state = inner_->state();
  for (const auto& s : slots_) {
    auto it = state_.find(compat::param_state_key(param_groups_[s.group].params()[s.index]));
    if (it != state_.end()) inner_state[compat::param_state_key(s.master)] = it->second->clone();
  }
  try {
    inner_->save(archive);
  } catch (...) {
    inner_state.clear();
    throw;
  }
  inner_state.clear();
}

void OffloadOptimizer::load(torch::serialize::InputArchive& archive) {
  sync_slots();
  inner_->load(archive);
  if (!all_on_cpu(archive)) {
    // State saved on a device (a run without offload): through a CPU copy of the archive.
    torch::serialize::OutputArchive out;
    inner_->save(out);
    std::stringstream bytes;
    out.save_to(bytes);
    torch::serialize::InputArchive on_cpu;
    on_cpu.load_from(bytes, c10::Device(c10::kCPU));
    inner_->load(on_cpu);
  }
  state_.clear();
  take_state();
  TRAINKIT_CHECK_ARG(inner_->state().empty(), "OffloadOptimizer::load: the archive holds state of {} tensors that are "
                     "not this optimizer's parameters", inner_->state().size());
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].set_options(inner_->param_groups()[g].options().clone());
  }
  reload_parameters();
}

HostOptimizerFactory offloaded(HostOptimizerFactory host, OffloadOptions options) {
  TRAINKIT_CHECK_ARG(host, "offloaded: the host optimizer factory is empty");
  return [host = std::move(host), options](std::vector<torch::optim::OptimizerParamGroup> groups) {
    return std::make_unique<OffloadOptimizer>(std::move(groups), host, options);
  };
}

}  // namespace trainkit::optim
