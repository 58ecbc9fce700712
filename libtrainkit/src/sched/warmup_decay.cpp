#include "trainkit/sched/warmup_decay.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <c10/util/MathConstants.h>

#include "trainkit/sched/factory.h"

namespace trainkit::sched {
namespace {

constexpr const char* kWsd = "WarmupStableDecay";

/// Decay steps of `o`: num_decay_steps, or decay_ratio·num_training_steps
/// rounded to the nearest step.
int64_t decay_steps(const WarmupStableDecayOptions& o) {
  if (o.num_decay_steps()) {
    return *o.num_decay_steps();
  }
  return std::llround(*o.decay_ratio() * static_cast<double>(*o.num_training_steps()));
}

/// Stable steps of `o`: num_stable_steps, or what num_training_steps leaves
/// after warmup and decay.
int64_t stable_steps(const WarmupStableDecayOptions& o) {
  return o.num_stable_steps() ? *o.num_stable_steps() : *o.num_training_steps() - o.num_warmup_steps() - decay_steps(o);
}

/// Every LR of `bases` times `f`.
std::vector<double> scaled(std::vector<double> bases, double f) {
  for (double& lr : bases) {
    lr *= f;
  }
  return bases;
}

}  // namespace

void WarmupStableDecay::validate(const WarmupStableDecayOptions& o) {
  check_options(WarmupStableDecayOptions::binding(), o, kWsd);
  if (o.num_decay_steps().has_value() == o.decay_ratio().has_value()) {
    throw std::invalid_argument(std::string(kWsd) + ": give one of num_decay_steps and decay_ratio");
  }
  if (o.num_training_steps().has_value() == o.num_stable_steps().has_value()) {
    throw std::invalid_argument(std::string(kWsd) + ": give one of num_training_steps and num_stable_steps");
  }
  if (o.decay_ratio() && !o.num_training_steps()) {
    throw std::invalid_argument(std::string(kWsd) + ": decay_ratio needs num_training_steps");
  }
  check_arg(stable_steps(o) >= 0, kWsd, "num_training_steps", static_cast<double>(o.num_training_steps().value_or(0)),
            "must be >= num_warmup_steps + decay steps");
}

WarmupStableDecay::WarmupStableDecay(torch::optim::Optimizer& optimizer, WarmupStableDecayOptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  validate(options_);
  decay_ = decay_steps(options_);
  stable_ = stable_steps(options_);
  initial_step();
}

std::vector<double> WarmupStableDecay::get_lr() { return *closed_form_lr(); }

std::optional<std::vector<double>> WarmupStableDecay::closed_form_lr() const {
  const int64_t t = last_epoch_;
  const int64_t warmup = options_.num_warmup_steps();
  const double m = options_.min_lr_ratio();
  double f = m;  // after the decay
  if (t < warmup) {
    const double p = static_cast<double>(t) / static_cast<double>(warmup);
    const std::string& shape = options_.warmup_type();
    const double w = shape == "linear"   ? p
                     : shape == "cosine" ? (1 - std::cos(c10::pi<double> * p)) / 2
                                         : 1 - std::sqrt(1 - p);
    f = m + (1 - m) * w;
  } else if (t < warmup + stable_) {
    f = 1.0;
  } else if (t < warmup + stable_ + decay_) {
    const double p = static_cast<double>(t - warmup - stable_) / static_cast<double>(decay_);
    const std::string& shape = options_.decay_type();
    const double d = shape == "linear"   ? 1 - p
                     : shape == "cosine" ? (1 + std::cos(2 * c10::pi<double> * options_.num_cycles() * p)) / 2
                                         : 1 - std::sqrt(p);
    f = m + (1 - m) * d;
  }
  return scaled(base_lrs_, f);
}

void InverseSqrt::validate(const InverseSqrtOptions& o) {
  check_options(InverseSqrtOptions::binding(), o, "InverseSqrt");
}

InverseSqrt::InverseSqrt(torch::optim::Optimizer& optimizer, InverseSqrtOptions options)
    : LRScheduler(optimizer), options_(options) {
  validate(options_);
  initial_step();
}

int64_t InverseSqrt::timescale() const {
  const int64_t warmup = options_.num_warmup_steps();
  return options_.timescale().value_or(warmup > 0 ? warmup : 10000);
}

std::vector<double> InverseSqrt::get_lr() { return *closed_form_lr(); }

std::optional<std::vector<double>> InverseSqrt::closed_form_lr() const {
  const int64_t t = last_epoch_;
  const int64_t warmup = options_.num_warmup_steps();
  const double T = static_cast<double>(timescale());
  const double f = t < warmup ? static_cast<double>(t) / static_cast<double>(warmup)
                              : 1.0 / std::sqrt(static_cast<double>(t + timescale() - warmup) / T);
  return scaled(base_lrs_, f);
}

bool register_warmup_decay_schedulers() {
  // Without num_training_steps and num_stable_steps, WarmupStableDecay spans the whole run (known when it is
  // built). Until then the checks that need no length run on a copy with lengths that need no run.
  const WarmupStableDecayOptions defaults(0);
  const auto reader = [defaults](ArgReader& a, const std::string& interval) -> SchedulerMaker {
    const bool from_run = !a.has("num_training_steps") && !a.has("num_stable_steps");
    WarmupStableDecayOptions o = defaults;
    read_options(WarmupStableDecayOptions::binding(), a, o);
    if (!from_run) {
      return validated_maker<WarmupStableDecay>(a, o);
    }
    WarmupStableDecayOptions placeholder = o;
    placeholder.num_stable_steps(0);
    if (placeholder.decay_ratio()) {
      placeholder.decay_ratio(std::nullopt).num_decay_steps(0);
    }
    check_at(a.where(), [&placeholder] { WarmupStableDecay::validate(placeholder); });
    const std::string where = a.where();
    return [o, interval, where](torch::optim::Optimizer& opt, const SchedulerContext& context) {
      WarmupStableDecayOptions run = o;
      run.num_training_steps(required_run_length(context, interval, where, "num_training_steps"));
      return std::make_shared<WarmupStableDecay>(opt, run);
    };
  };
  register_scheduler(kWsd, "step", reader, scheduler_arg_docs(WarmupStableDecayOptions::binding(), defaults));
  register_bound_scheduler<InverseSqrt>("InverseSqrt", "step", InverseSqrtOptions(0));
  return true;
}

}  // namespace trainkit::sched
