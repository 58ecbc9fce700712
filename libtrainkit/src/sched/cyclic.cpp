#include "trainkit/sched/cyclic.h"

#include <array>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/sched/factory.h"

namespace trainkit::sched {
namespace {

/// One value per param group from one value or one per group (PyTorch's _format_param).
std::vector<double> per_group(const std::vector<double>& v, size_t groups, const std::string& scheduler,
                              const char* name) {
  if (v.size() == 1) {
    return std::vector<double>(groups, v[0]);
  }
  if (v.size() != groups) {
    throw std::invalid_argument(fmt::format("{}: {} has {} values, the optimizer has {} param groups", scheduler,
                                            name, v.size(), groups));
  }
  return v;
}

template <class Fn>
auto with_momentum(const torch::optim::OptimizerOptions& options, Fn fn) -> decltype(fn(0.0, nullptr)) {
  using namespace torch::optim;
  if (const auto* o = dynamic_cast<const SGDOptions*>(&options)) {
    return fn(o->momentum(), nullptr);
  }
  if (const auto* o = dynamic_cast<const RMSpropOptions*>(&options)) {
    return fn(o->momentum(), nullptr);
  }
  if (const auto* o = dynamic_cast<const AdamOptions*>(&options)) {
    return fn(std::get<0>(o->betas()), nullptr);
  }
  if (const auto* o = dynamic_cast<const AdamWOptions*>(&options)) {
    return fn(std::get<0>(o->betas()), nullptr);
  }
  if (const auto* o = dynamic_cast<const CyclableMomentum*>(&options)) {
    return fn(o->cycled_momentum(), o);
  }
  throw std::invalid_argument(
      "optimizer must support momentum or beta1 with cycle_momentum enabled (SGD, RMSprop, Adam, AdamW, or "
      "options implementing trainkit::optim::CyclableMomentum)");
}

void require_momentum(const torch::optim::Optimizer& opt, const std::string& scheduler) {
  for (const auto& g : opt.param_groups()) {
    if (!has_cyclable_momentum(g)) {
      throw std::invalid_argument(scheduler + ": optimizer must support momentum or beta1 with cycle_momentum = true");
    }
  }
}

}  // namespace

bool has_cyclable_momentum(const torch::optim::OptimizerParamGroup& group) {
  try {
    with_momentum(group.options(), [](double, const CyclableMomentum*) { return 0.0; });
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

double get_cyclable_momentum(const torch::optim::OptimizerParamGroup& group) {
  return with_momentum(group.options(), [](double m, const CyclableMomentum*) { return m; });
}

void set_cyclable_momentum(torch::optim::OptimizerParamGroup& group, double momentum) {
  using namespace torch::optim;
  auto& options = group.options();
  if (auto* o = dynamic_cast<SGDOptions*>(&options)) {
    o->momentum(momentum);
  } else if (auto* o = dynamic_cast<RMSpropOptions*>(&options)) {
    o->momentum(momentum);
  } else if (auto* o = dynamic_cast<AdamOptions*>(&options)) {
    o->betas({momentum, std::get<1>(o->betas())});
  } else if (auto* o = dynamic_cast<AdamWOptions*>(&options)) {
    o->betas({momentum, std::get<1>(o->betas())});
  } else if (auto* o = dynamic_cast<CyclableMomentum*>(&options)) {
    o->set_cycled_momentum(momentum);
  } else {
    throw std::invalid_argument("set_cyclable_momentum: the optimizer has no momentum or beta1");
  }
}

void CyclicLR::validate(const CyclicLROptions& o) {
  check_options(CyclicLROptions::binding(), o, "CyclicLR");
  // Per-group values broadcast when one side has a single value; the group count is checked on construction.
  const auto& base = o.base_lr();
  const auto& max = o.max_lr();
  const size_t n = std::max(base.size(), max.size());
  for (size_t i = 0; i < n; ++i) {
    const double b = base[base.size() == 1 ? 0 : std::min(i, base.size() - 1)];
    const double m = max[max.size() == 1 ? 0 : std::min(i, max.size() - 1)];
    check_arg(m >= b, "CyclicLR", "max_lr", m, "must be >= base_lr");
  }
  if (o.scale_fn() && o.scale_mode() != "cycle" && o.scale_mode() != "iterations") {
    throw std::invalid_argument("CyclicLR: invalid scale_mode: " + o.scale_mode() + " (\"cycle\" or \"iterations\")");
  }
}

CyclicLR::CyclicLR(torch::optim::Optimizer& optimizer, CyclicLROptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  validate(options_);
  const size_t n = num_groups();
  const std::vector<double> base = per_group(options_.base_lr(), n, name(), "base_lr");
  max_lrs_ = per_group(options_.max_lr(), n, name(), "max_lr");
  const double up = static_cast<double>(options_.step_size_up());
  const double down = options_.step_size_down() > 0 ? static_cast<double>(options_.step_size_down()) : up;
  total_size_ = up + down;
  step_ratio_ = up / total_size_;
  scale_by_cycle_ = options_.scale_fn() ? options_.scale_mode() == "cycle" : options_.mode() != "exp_range";
  for (size_t i = 0; i < n; ++i) {
    optimizer_.param_groups()[i].options().set_lr(base[i]);
  }
  setdefault_initial_lrs();
  if (options_.cycle_momentum()) {
    require_momentum(optimizer_, name());
    base_momentums_ = per_group(options_.base_momentum(), n, name(), "base_momentum");
    max_momentums_ = per_group(options_.max_momentum(), n, name(), "max_momentum");
    for (size_t i = 0; i < n; ++i) {
      set_cyclable_momentum(optimizer_.param_groups()[i], max_momentums_[i]);
    }
  }
  initial_step();
  base_lrs_ = base;
}

double CyclicLR::scale(double x) const {
  if (options_.scale_fn()) {
    return options_.scale_fn()(x);
  }
  if (options_.mode() == "triangular") {
    return 1.0;
  }
  if (options_.mode() == "triangular2") {
    return 1 / std::pow(2.0, x - 1);
  }
  return std::pow(options_.gamma(), x);
}

std::vector<double> CyclicLR::get_lr() {
  // base_lrs_ is PyTorch's: during the initial step it still holds the groups' initial_lr, which
  // CyclicLR has just set to base_lr, so both agree.
  const double e = static_cast<double>(last_epoch_);
  const double cycle = std::floor(1 + e / total_size_);
  const double x = 1.0 + e / total_size_ - cycle;
  const double scale_factor = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
  const double s = scale(scale_by_cycle_ ? cycle : e);
  std::vector<double> lrs;
  for (size_t i = 0; i < num_groups(); ++i) {
    const double base_height = (max_lrs_[i] - base_lrs_[i]) * scale_factor;
    lrs.push_back(base_lrs_[i] + base_height * s);
  }
  if (options_.cycle_momentum()) {
    for (size_t i = 0; i < num_groups(); ++i) {
      const double base_height = (max_momentums_[i] - base_momentums_[i]) * scale_factor;
      set_cyclable_momentum(optimizer_.param_groups()[i], max_momentums_[i] - base_height * s);
    }
  }
  return lrs;
}

void OneCycleLR::validate(const OneCycleLROptions& o) { check_options(OneCycleLROptions::binding(), o, "OneCycleLR"); }

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, OneCycleLROptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  if (options_.total_steps() > 0) {
    total_steps_ = options_.total_steps();
  } else if (options_.epochs() > 0 && options_.steps_per_epoch() > 0) {
    total_steps_ = options_.epochs() * options_.steps_per_epoch();
  } else {
    throw std::invalid_argument(fmt::format(
        "OneCycleLR: define total_steps > 0 or both epochs and steps_per_epoch > 0 (got total_steps {}, epochs {}, "
        "steps_per_epoch {})",
        options_.total_steps(), options_.epochs(), options_.steps_per_epoch()));
  }
  validate(options_);
  const double pct = options_.pct_start();
  enum { kInitial, kMax, kMin, kMaxMomentum, kBaseMomentum };
  const double total = static_cast<double>(total_steps_);
  if (options_.three_phase()) {
    phases_ = {{pct * total - 1, kInitial, kMax, kMaxMomentum, kBaseMomentum},
               {2 * pct * total - 2, kMax, kInitial, kBaseMomentum, kMaxMomentum},
               {total - 1, kInitial, kMin, kMaxMomentum, kMaxMomentum}};
  } else {
    phases_ = {{pct * total - 1, kInitial, kMax, kMaxMomentum, kBaseMomentum},
               {total - 1, kMax, kMin, kBaseMomentum, kMaxMomentum}};
  }
  const size_t n = num_groups();
  const std::vector<double> max_lrs = per_group(options_.max_lr(), n, name(), "max_lr");
  values_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const double initial = max_lrs[i] / options_.div_factor();
    values_[i] = {initial, max_lrs[i], initial / options_.final_div_factor(), 0.0, 0.0};
    set_initial_lr(i, initial);
    base_lrs_[i] = initial;
  }
  if (options_.cycle_momentum()) {
    require_momentum(optimizer_, name());
    const auto max_m = per_group(options_.max_momentum(), n, name(), "max_momentum");
    const auto base_m = per_group(options_.base_momentum(), n, name(), "base_momentum");
    for (size_t i = 0; i < n; ++i) {
      set_cyclable_momentum(optimizer_.param_groups()[i], max_m[i]);
      values_[i][kMaxMomentum] = max_m[i];
      values_[i][kBaseMomentum] = base_m[i];
    }
  }
  initial_step();
}

std::vector<double> OneCycleLR::get_lr() {
  const int64_t step_num = last_epoch_;
  if (step_num > total_steps_) {
    throw std::invalid_argument(fmt::format("OneCycleLR: tried to step {} times; total_steps is {}", step_num,
                                            total_steps_));
  }
  const auto anneal = [this](double start, double end, double pct) {
    if (options_.anneal_strategy() == "cos") {
      constexpr double pi = 3.14159265358979323846;
      return end + (start - end) / 2.0 * (std::cos(pi * pct) + 1);
    }
    return (end - start) * pct + start;
  };
  std::vector<double> lrs;
  for (size_t g = 0; g < num_groups(); ++g) {
    const auto& v = values_[g];
    double start_step = 0.0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      if (static_cast<double>(step_num) <= phase.end_step || i == phases_.size() - 1) {
        const double pct = (static_cast<double>(step_num) - start_step) / (phase.end_step - start_step);
        lrs.push_back(anneal(v[static_cast<size_t>(phase.start_lr)], v[static_cast<size_t>(phase.end_lr)], pct));
        if (options_.cycle_momentum()) {
          set_cyclable_momentum(optimizer_.param_groups()[g],
                                anneal(v[static_cast<size_t>(phase.start_momentum)],
                                       v[static_cast<size_t>(phase.end_momentum)], pct));
        }
        break;
      }
      start_step = phase.end_step;
    }
  }
  return lrs;
}

bool register_cyclic_schedulers() {
  register_bound_scheduler<CyclicLR>("CyclicLR", "step", CyclicLROptions({0.0}, {0.0}));
  // Without total_steps (or epochs and steps_per_epoch), the cycle spans the whole run.
  const OneCycleLROptions defaults({1.0});
  const auto reader = [defaults](ArgReader& a, const std::string& interval) -> SchedulerMaker {
    const bool from_run = !a.has("total_steps") && !a.has("epochs") && !a.has("steps_per_epoch");
    OneCycleLROptions o = defaults;
    read_options(OneCycleLROptions::binding(), a, o);
    check_at(a.where(), [&o] { OneCycleLR::validate(o); });
    return [o, from_run, interval](torch::optim::Optimizer& opt, const SchedulerContext& context) {
      OneCycleLROptions run = o;
      if (from_run) {
        run.total_steps(run_length(context, interval));
      }
      return std::make_shared<OneCycleLR>(opt, run);
    };
  };
  register_scheduler("OneCycleLR", "step", reader, scheduler_arg_docs(OneCycleLROptions::binding(), defaults));
  return true;
}

}  // namespace trainkit::sched
