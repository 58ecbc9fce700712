#include "trainkit/sched/cosine.h"

#include <cmath>

#include <torch/torch.h>

#include "trainkit/sched/factory.h"

namespace trainkit::sched {
namespace {

constexpr double kPi = 3.14159265358979323846;

/// Python's `a % b` for ints (the result has the sign of b).
int64_t py_mod(int64_t a, int64_t b) {
  const int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

}  // namespace

void CosineAnnealingLR::validate(const CosineAnnealingLROptions& o) {
  check_options(CosineAnnealingLROptions::binding(), o, "CosineAnnealingLR");
}

CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer, CosineAnnealingLROptions options)
    : LRScheduler(optimizer), options_(options) {
  validate(options_);
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() {
  const double T = static_cast<double>(options_.T_max());
  const double eta = options_.eta_min();
  const double t = static_cast<double>(last_epoch_);
  std::vector<double> lrs = group_lrs();
  if (is_initial_) {
    return lrs;
  }
  if (step_count_ == 1 && last_epoch_ > 0) {
    for (size_t i = 0; i < lrs.size(); ++i) {
      lrs[i] = eta + (base_lrs_[i] - eta) * (1 + std::cos(t * kPi / T)) / 2;
    }
  } else if (py_mod(last_epoch_ - 1 - options_.T_max(), 2 * options_.T_max()) == 0) {
    for (size_t i = 0; i < lrs.size(); ++i) {
      lrs[i] = lrs[i] + (base_lrs_[i] - eta) * (1 - std::cos(kPi / T)) / 2;
    }
  } else {
    for (double& lr : lrs) {
      lr = (1 + std::cos(kPi * t / T)) / (1 + std::cos(kPi * (t - 1) / T)) * (lr - eta) + eta;
    }
  }
  return lrs;
}

std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() const {
  std::vector<double> lrs;
  const double T = static_cast<double>(options_.T_max());
  for (const double base : base_lrs_) {
    lrs.push_back(options_.eta_min() +
                  (base - options_.eta_min()) * (1 + std::cos(kPi * static_cast<double>(last_epoch_) / T)) / 2);
  }
  return lrs;
}

void CosineAnnealingWarmRestarts::validate(const CosineAnnealingWarmRestartsOptions& o) {
  check_options(CosineAnnealingWarmRestartsOptions::binding(), o, "CosineAnnealingWarmRestarts");
}

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer,
                                                         CosineAnnealingWarmRestartsOptions options)
    : LRScheduler(optimizer), options_(options), T_i_(options.T_0()) {
  validate(options_);
  initial_step();
}

void CosineAnnealingWarmRestarts::step() {
  ++step_count_;
  if (last_epoch_ < 0) {
    T_i_ = options_.T_0();
    T_cur_ = 0;
    last_epoch_ = 0;
  } else {
    ++last_epoch_;
    ++T_cur_;
    if (T_cur_ >= T_i_) {
      T_cur_ = T_cur_ % T_i_;
      T_i_ = T_i_ * options_.T_mult();
    }
  }
  apply_lrs(get_lr());
}

std::vector<double> CosineAnnealingWarmRestarts::get_lr() {
  std::vector<double> lrs;
  const double eta = options_.eta_min();
  for (const double base : base_lrs_) {
    lrs.push_back(eta + (base - eta) * (1 + std::cos(kPi * static_cast<double>(T_cur_) / static_cast<double>(T_i_))) / 2);
  }
  return lrs;
}

void CosineAnnealingWarmRestarts::save_extra(torch::serialize::OutputArchive& archive) const {
  archive.write("T_i", torch::tensor(T_i_));
  archive.write("T_cur", torch::tensor(T_cur_));
}

void CosineAnnealingWarmRestarts::load_extra(torch::serialize::InputArchive& archive) {
  at::Tensor t;
  archive.read("T_i", t);
  T_i_ = t.item<int64_t>();
  archive.read("T_cur", t);
  T_cur_ = t.item<int64_t>();
}

void WarmupCosine::validate(const WarmupCosineOptions& o) {
  check_options(WarmupCosineOptions::binding(), o, "WarmupCosine");
  check_arg(o.total_steps() > o.warmup_steps(), "WarmupCosine", "total_steps",
            static_cast<double>(o.total_steps()), "must be > warmup_steps");
}

WarmupCosine::WarmupCosine(torch::optim::Optimizer& optimizer, WarmupCosineOptions options)
    : LRScheduler(optimizer), options_(options) {
  validate(options_);
  initial_step();
}

std::vector<double> WarmupCosine::get_lr() { return *closed_form_lr(); }

std::optional<std::vector<double>> WarmupCosine::closed_form_lr() const {
  const int64_t t = last_epoch_;
  const int64_t w = options_.warmup_steps();
  const int64_t total = options_.total_steps();
  const double eta = options_.eta_min();
  std::vector<double> lrs;
  for (const double base : base_lrs_) {
    if (t < w) {
      const double s = options_.warmup_start_factor();
      lrs.push_back(base * (s + (1.0 - s) * static_cast<double>(t) / static_cast<double>(w)));
    } else if (t <= total) {
      const double progress = static_cast<double>(t - w) / static_cast<double>(total - w);
      lrs.push_back(eta + (base - eta) * (1 + std::cos(kPi * progress)) / 2);
    } else {
      lrs.push_back(eta);
    }
  }
  return lrs;
}

bool register_cosine_schedulers() {
  register_bound_scheduler<CosineAnnealingLR>("CosineAnnealingLR", "epoch", CosineAnnealingLROptions(1));
  register_bound_scheduler<CosineAnnealingWarmRestarts>("CosineAnnealingWarmRestarts", "epoch",
                                                        CosineAnnealingWarmRestartsOptions(1));
  // Without total_steps, the schedule spans the whole run (known when it is built).
  const WarmupCosineOptions defaults(0, 1);
  const auto reader = [defaults](ArgReader& a, const std::string& interval) -> SchedulerMaker {
    const bool from_run = !a.has("total_steps");
    WarmupCosineOptions o = defaults;
    read_options(WarmupCosineOptions::binding(), a, o);
    if (from_run) {
      o.total_steps(o.warmup_steps() + 1);  // checked now; replaced by the run's length when built
    }
    check_at(a.where(), [&o] { WarmupCosine::validate(o); });
    const std::string where = a.where();
    return [o, from_run, interval, where](torch::optim::Optimizer& opt, const SchedulerContext& context) {
      WarmupCosineOptions run = o;
      if (from_run) {
        run.total_steps(required_run_length(context, interval, where, "total_steps"));
      }
      return std::make_shared<WarmupCosine>(opt, run);
    };
  };
  register_scheduler("WarmupCosine", "step", reader, scheduler_arg_docs(WarmupCosineOptions::binding(), defaults));
  return true;
}

}  // namespace trainkit::sched
