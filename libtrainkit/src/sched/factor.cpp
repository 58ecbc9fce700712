#include "trainkit/sched/factor.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "trainkit/sched/factory.h"

namespace trainkit::sched {
namespace {

std::vector<LrLambda> per_group(const torch::optim::Optimizer& opt, std::vector<LrLambda> lambdas,
                                const char* scheduler) {
  if (lambdas.size() != opt.param_groups().size()) {
    throw std::invalid_argument(fmt::format("{}: expected {} lr_lambdas (one per param group), got {}", scheduler,
                                            opt.param_groups().size(), lambdas.size()));
  }
  for (const auto& f : lambdas) {
    if (!f) {
      throw std::invalid_argument(fmt::format("{}: lr_lambda must be callable", scheduler));
    }
  }
  return lambdas;
}

template <class F>
std::vector<double> map_lrs(const std::vector<double>& lrs, F f) {
  std::vector<double> out;
  out.reserve(lrs.size());
  for (size_t i = 0; i < lrs.size(); ++i) {
    out.push_back(f(i, lrs[i]));
  }
  return out;
}

}  // namespace

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, LrLambda lr_lambda)
    : LambdaLR(optimizer, std::vector<LrLambda>(optimizer.param_groups().size(), std::move(lr_lambda))) {}

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::vector<LrLambda> lr_lambdas)
    : LRScheduler(optimizer), lambdas_(per_group(optimizer, std::move(lr_lambdas), "LambdaLR")) {
  initial_step();
}

std::vector<double> LambdaLR::get_lr() {
  return map_lrs(base_lrs_, [this](size_t i, double base) { return base * lambdas_[i](last_epoch_); });
}

MultiplicativeLR::MultiplicativeLR(torch::optim::Optimizer& optimizer, LrLambda lr_lambda)
    : MultiplicativeLR(optimizer, std::vector<LrLambda>(optimizer.param_groups().size(), std::move(lr_lambda))) {}

MultiplicativeLR::MultiplicativeLR(torch::optim::Optimizer& optimizer, std::vector<LrLambda> lr_lambdas)
    : LRScheduler(optimizer), lambdas_(per_group(optimizer, std::move(lr_lambdas), "MultiplicativeLR")) {
  initial_step();
}

std::vector<double> MultiplicativeLR::get_lr() {
  if (is_initial_) {
    return group_lrs();
  }
  return map_lrs(group_lrs(), [this](size_t i, double lr) { return lr * lambdas_[i](last_epoch_); });
}

void StepLR::validate(const StepLROptions& o) { check_options(StepLROptions::binding(), o, "StepLR"); }

StepLR::StepLR(torch::optim::Optimizer& optimizer, StepLROptions options)
    : LRScheduler(optimizer), options_(options) {
  validate(options_);
  initial_step();
}

std::vector<double> StepLR::get_lr() {
  if (last_epoch_ == 0 || last_epoch_ % options_.step_size() != 0) {
    return group_lrs();
  }
  return map_lrs(group_lrs(), [this](size_t, double lr) { return lr * options_.gamma(); });
}

std::optional<std::vector<double>> StepLR::closed_form_lr() const {
  return map_lrs(base_lrs_, [this](size_t, double base) {
    return base * std::pow(options_.gamma(), static_cast<double>(last_epoch_ / options_.step_size()));
  });
}

void MultiStepLR::validate(const MultiStepLROptions& o) {
  check_options(MultiStepLROptions::binding(), o, "MultiStepLR");
}

MultiStepLR::MultiStepLR(torch::optim::Optimizer& optimizer, MultiStepLROptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  validate(options_);
  std::sort(options_.milestones().begin(), options_.milestones().end());
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() {
  const auto& ms = options_.milestones();
  const auto count = std::count(ms.begin(), ms.end(), last_epoch_);
  if (count == 0) {
    return group_lrs();
  }
  return map_lrs(group_lrs(), [&](size_t, double lr) {
    return lr * std::pow(options_.gamma(), static_cast<double>(count));
  });
}

std::optional<std::vector<double>> MultiStepLR::closed_form_lr() const {
  const auto& ms = options_.milestones();
  const auto passed = std::upper_bound(ms.begin(), ms.end(), last_epoch_) - ms.begin();
  return map_lrs(base_lrs_, [&](size_t, double base) {
    return base * std::pow(options_.gamma(), static_cast<double>(passed));
  });
}

void ConstantLR::validate(const ConstantLROptions& o) {
  check_options(ConstantLROptions::binding(), o, "ConstantLR");
}

ConstantLR::ConstantLR(torch::optim::Optimizer& optimizer, ConstantLROptions options)
    : LRScheduler(optimizer), options_(options) {
  validate(options_);
  initial_step();
}

std::vector<double> ConstantLR::get_lr() {
  if (last_epoch_ == 0) {
    return map_lrs(group_lrs(), [this](size_t, double lr) { return lr * options_.factor(); });
  }
  if (last_epoch_ != options_.total_iters()) {
    return group_lrs();
  }
  return map_lrs(group_lrs(), [this](size_t, double lr) { return lr * (1.0 / options_.factor()); });
}

std::optional<std::vector<double>> ConstantLR::closed_form_lr() const {
  const double f = options_.factor() + (last_epoch_ >= options_.total_iters() ? 1.0 - options_.factor() : 0.0);
  return map_lrs(base_lrs_, [f](size_t, double base) { return base * f; });
}

void LinearLR::validate(const LinearLROptions& o) { check_options(LinearLROptions::binding(), o, "LinearLR"); }

LinearLR::LinearLR(torch::optim::Optimizer& optimizer, LinearLROptions options)
    : LRScheduler(optimizer), options_(options) {
  validate(options_);
  initial_step();
}

std::vector<double> LinearLR::get_lr() {
  if (last_epoch_ == 0) {
    return map_lrs(group_lrs(), [this](size_t, double lr) { return lr * options_.start_factor(); });
  }
  if (is_initial_ || last_epoch_ > options_.total_iters()) {
    return group_lrs();
  }
  const double s = options_.start_factor();
  const double e = options_.end_factor();
  const double t = static_cast<double>(options_.total_iters());
  const double factor = 1.0 + (e - s) / (t * s + static_cast<double>(last_epoch_ - 1) * (e - s));
  return map_lrs(group_lrs(), [factor](size_t, double lr) { return lr * factor; });
}

std::optional<std::vector<double>> LinearLR::closed_form_lr() const {
  const double s = options_.start_factor();
  const double e = options_.end_factor();
  const double t = static_cast<double>(std::min(options_.total_iters(), last_epoch_));
  return map_lrs(base_lrs_, [&](size_t, double base) {
    return base * (s + (e - s) * t / static_cast<double>(options_.total_iters()));
  });
}

void ExponentialLR::validate(const ExponentialLROptions& o) {
  check_options(ExponentialLROptions::binding(), o, "ExponentialLR");
}

ExponentialLR::ExponentialLR(torch::optim::Optimizer& optimizer, ExponentialLROptions options)
    : LRScheduler(optimizer), options_(options) {
  validate(options_);
  initial_step();
}

std::vector<double> ExponentialLR::get_lr() {
  if (is_initial_) {
    return group_lrs();
  }
  return map_lrs(group_lrs(), [this](size_t, double lr) { return lr * options_.gamma(); });
}

std::optional<std::vector<double>> ExponentialLR::closed_form_lr() const {
  return map_lrs(base_lrs_, [this](size_t, double base) {
    return base * std::pow(options_.gamma(), static_cast<double>(last_epoch_));
  });
}

void PolynomialLR::validate(const PolynomialLROptions& o) {
  check_options(PolynomialLROptions::binding(), o, "PolynomialLR");
}

PolynomialLR::PolynomialLR(torch::optim::Optimizer& optimizer, PolynomialLROptions options)
    : LRScheduler(optimizer), options_(options) {
  validate(options_);
  initial_step();
}

std::vector<double> PolynomialLR::get_lr() {
  if (is_initial_ || last_epoch_ > options_.total_iters()) {
    return group_lrs();
  }
  const double t = static_cast<double>(options_.total_iters());
  const double e = static_cast<double>(last_epoch_);
  const double decay = std::pow((1.0 - e / t) / (1.0 - (e - 1) / t), options_.power());
  return map_lrs(group_lrs(), [decay](size_t, double lr) { return lr * decay; });
}

std::optional<std::vector<double>> PolynomialLR::closed_form_lr() const {
  const double t = static_cast<double>(options_.total_iters());
  const double e = static_cast<double>(std::min(options_.total_iters(), last_epoch_));
  return map_lrs(base_lrs_, [&](size_t, double base) { return base * std::pow(1.0 - e / t, options_.power()); });
}

bool register_factor_schedulers() {
  register_bound_scheduler<StepLR>("StepLR", "epoch", StepLROptions(1));
  register_bound_scheduler<MultiStepLR>("MultiStepLR", "epoch", MultiStepLROptions({0}));
  register_bound_scheduler<ConstantLR>("ConstantLR", "epoch", ConstantLROptions());
  register_bound_scheduler<LinearLR>("LinearLR", "epoch", LinearLROptions());
  register_bound_scheduler<ExponentialLR>("ExponentialLR", "epoch", ExponentialLROptions(0.1));
  register_bound_scheduler<PolynomialLR>("PolynomialLR", "epoch", PolynomialLROptions());
  for (const std::string type : {"LambdaLR", "MultiplicativeLR"}) {
    register_scheduler(type, "epoch", [type](ArgReader& a, const std::string&) -> SchedulerMaker {
      a.fail(fmt::format("{} needs a C++ function (lr_lambda) and cannot be built from a config; construct "
                         "trainkit::sched::{} in code",
                         type, type));
    });
  }
  return true;
}

}  // namespace trainkit::sched
