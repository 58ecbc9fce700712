#include "trainkit/sched/scheduler.h"

#include <map>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::sched {
namespace {

/// PyTorch keeps `initial_lr` inside each param group, so every scheduler of an optimizer sees the value
/// the first one recorded (SequentialLR relies on this). LibTorch's options have no such field; this
/// registry, keyed by the group's options object and alive while any scheduler of that group is, holds it.
struct InitialLrRegistry {
  struct Entry {
    double lr;
    int refs;
  };
  std::mutex mutex;
  std::map<const void*, Entry> entries;

  static InitialLrRegistry& instance() {
    static InitialLrRegistry registry;
    return registry;
  }
};

const void* group_key(const torch::optim::Optimizer& opt, size_t i) { return &opt.param_groups()[i].options(); }

}  // namespace

void check_arg(bool ok, const std::string& scheduler, const std::string& name, double value,
               const std::string& expected) {
  if (!ok) {
    throw std::invalid_argument(fmt::format("{}: invalid {}: {} ({})", scheduler, name, value, expected));
  }
}

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
  auto& reg = InitialLrRegistry::instance();
  std::lock_guard<std::mutex> lock(reg.mutex);
  for (size_t i = 0; i < num_groups(); ++i) {
    const double lr = optimizer_.param_groups()[i].options().get_lr();
    group_keys_.push_back(group_key(optimizer_, i));
    auto [it, inserted] = reg.entries.try_emplace(group_keys_.back(), InitialLrRegistry::Entry{lr, 0});
    ++it->second.refs;
    first_of_group_.push_back(inserted);
    base_lrs_.push_back(it->second.lr);
  }
  last_lr_ = group_lrs();
}

LRScheduler::~LRScheduler() {
  auto& reg = InitialLrRegistry::instance();
  std::lock_guard<std::mutex> lock(reg.mutex);
  // The keys recorded at construction: the optimizer may already be gone.
  for (const void* key : group_keys_) {
    const auto it = reg.entries.find(key);
    if (it != reg.entries.end() && --it->second.refs == 0) {
      reg.entries.erase(it);
    }
  }
}

double LRScheduler::initial_lr(size_t i) const {
  auto& reg = InitialLrRegistry::instance();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return reg.entries.at(group_key(optimizer_, i)).lr;
}

void LRScheduler::set_initial_lr(size_t i, double lr) {
  auto& reg = InitialLrRegistry::instance();
  std::lock_guard<std::mutex> lock(reg.mutex);
  reg.entries.at(group_key(optimizer_, i)).lr = lr;
}

void LRScheduler::setdefault_initial_lrs() {
  for (size_t i = 0; i < num_groups(); ++i) {
    if (first_of_group_[i]) {
      set_initial_lr(i, optimizer_.param_groups()[i].options().get_lr());
    }
    base_lrs_[i] = initial_lr(i);
  }
}

std::vector<double> LRScheduler::group_lrs() const {
  std::vector<double> out;
  for (const auto& g : optimizer_.param_groups()) {
    out.push_back(g.options().get_lr());
  }
  return out;
}

void LRScheduler::apply_lrs(const std::vector<double>& lrs) {
  TRAINKIT_CHECK_ARG(lrs.size() == num_groups(), "{}: {} LRs for {} param groups", name(), lrs.size(), num_groups());
  for (size_t i = 0; i < lrs.size(); ++i) {
    optimizer_.param_groups()[i].options().set_lr(lrs[i]);
  }
  last_lr_ = group_lrs();
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  is_initial_ = true;
  try {
    step();
  } catch (...) {
    is_initial_ = false;
    throw;
  }
  is_initial_ = false;
}

void LRScheduler::step() {
  ++step_count_;
  update_lr();
}

void LRScheduler::step(double metric) {
  throw std::logic_error(fmt::format("{} is not driven by a metric; call step() (got metric {})", name(), metric));
}

void LRScheduler::update_lr(std::optional<int64_t> epoch) {
  std::vector<double> lrs;
  if (!epoch) {
    ++last_epoch_;
    lrs = get_lr();
  } else {
    last_epoch_ = *epoch;
    auto closed = closed_form_lr();
    lrs = closed ? std::move(*closed) : get_lr();
  }
  apply_lrs(lrs);
}

void LRScheduler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("name", c10::IValue(name()));
  archive.write("last_epoch", torch::tensor(last_epoch_));
  archive.write("step_count", torch::tensor(step_count_));
  archive.write("base_lrs", torch::tensor(base_lrs_, torch::kFloat64));
  archive.write("last_lr", torch::tensor(last_lr_, torch::kFloat64));
  save_extra(archive);
}

void LRScheduler::load(torch::serialize::InputArchive& archive) {
  c10::IValue saved_name;
  archive.read("name", saved_name);
  if (saved_name.toStringRef() != name()) {
    throw std::invalid_argument(
        fmt::format("cannot load the state of a {} into a {}", saved_name.toStringRef(), name()));
  }
  const auto read_vec = [&archive](const char* key) {
    at::Tensor t;
    archive.read(key, t);
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  };
  at::Tensor t;
  archive.read("last_epoch", t);
  last_epoch_ = t.item<int64_t>();
  archive.read("step_count", t);
  step_count_ = t.item<int64_t>();
  base_lrs_ = read_vec("base_lrs");
  const std::vector<double> last = read_vec("last_lr");
  if (last.size() != num_groups()) {
    throw std::invalid_argument(fmt::format("{}: saved state has {} param groups, the optimizer has {}", name(),
                                            last.size(), num_groups()));
  }
  load_extra(archive);
  apply_lrs(last);
}

}  // namespace trainkit::sched
