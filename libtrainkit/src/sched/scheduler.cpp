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
/// the first one recorded (SequentialLR relies on this). LibTorch's options have no such field: the
/// schedulers of one group share a cell (a shared_ptr each), which ends with the last of them. This
/// registry only lets a new scheduler find the cell of its group: keyed by the group's options object and
/// checked against the group's parameters (an optimizer created where a freed one lived, over other
/// parameters, gets a cell of its own), holding weak references. It is never destroyed, and destructors do
/// not touch it, so a scheduler held by a global and destroyed after main() returns reads nothing that
/// static destruction has freed.
struct InitialLrRegistry {
  struct Entry {
    std::vector<const void*> params;  // the group's parameters (TensorImpl addresses) when the cell was made
    std::weak_ptr<double> cell;
  };
  std::mutex mutex;
  std::map<const void*, Entry> entries;

  static InitialLrRegistry& instance() {
    static auto* registry = new InitialLrRegistry;  // NOLINT(cppcoreguidelines-owning-memory): never destroyed
    return *registry;
  }
};

const void* group_key(const torch::optim::Optimizer& opt, size_t i) { return &opt.param_groups()[i].options(); }

std::vector<const void*> group_params(const torch::optim::Optimizer& opt, size_t i) {
  std::vector<const void*> out;
  for (const auto& p : opt.param_groups()[i].params()) out.push_back(p.unsafeGetTensorImpl());
  return out;
}

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
  for (auto it = reg.entries.begin(); it != reg.entries.end();) {  // groups whose schedulers are all gone
    it = it->second.cell.expired() ? reg.entries.erase(it) : std::next(it);
  }
  for (size_t i = 0; i < num_groups(); ++i) {
    auto& entry = reg.entries[group_key(optimizer_, i)];
    auto params = group_params(optimizer_, i);
    std::shared_ptr<double> cell = entry.params == params ? entry.cell.lock() : nullptr;
    first_of_group_.push_back(cell == nullptr);
    if (cell == nullptr) {
      cell = std::make_shared<double>(optimizer_.param_groups()[i].options().get_lr());
      entry = {std::move(params), cell};
    }
    base_lrs_.push_back(*cell);
    initial_lrs_.push_back(std::move(cell));
  }
  last_lr_ = group_lrs();
}

LRScheduler::~LRScheduler() = default;

double LRScheduler::initial_lr(size_t i) const { return *initial_lrs_.at(i); }

void LRScheduler::set_initial_lr(size_t i, double lr) { *initial_lrs_.at(i) = lr; }

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
