#pragma once
/// @file
/// Cosine schedules: CosineAnnealingLR (PyTorch's chainable form), CosineAnnealingWarmRestarts (SGDR,
/// Loshchilov & Hutter 2017, arXiv 1608.03983) and WarmupCosine (linear warmup, then cosine to eta_min).

#include <torch/arg.h>

#include "trainkit/options.h"
#include "trainkit/sched/scheduler.h"

namespace trainkit::sched {

/// Options of CosineAnnealingLR.
struct CosineAnnealingLROptions {
  explicit CosineAnnealingLROptions(int64_t T_max) : T_max_(T_max) {}
  /// Half period, in steps (>= 1).
  TORCH_ARG(int64_t, T_max);
  /// Minimum LR (>= 0).
  TORCH_ARG(double, eta_min) = 0.0;

 public:
  /// The config keys (`[scheduler]` of type CosineAnnealingLR): names, rules and help.
  static const OptionBinding<CosineAnnealingLROptions>& binding() {
    static const auto b = OptionBinding<CosineAnnealingLROptions>()
                              .bind(TRAINKIT_OPTION(T_max), rule::integer(1),
                                    "Half period (past it the LR rises again, as in PyTorch)")
                              .required()
                              .bind(TRAINKIT_OPTION(eta_min), rule::number(non_negative()), "Minimum LR");
    return b;
  }
};

/// PyTorch's recursive form of eta_min + (base - eta_min)(1 + cos(π·t/T_max))/2; past T_max it keeps
/// oscillating with period 2·T_max, exactly as PyTorch does.
class CosineAnnealingLR : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const CosineAnnealingLROptions& options);
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, CosineAnnealingLROptions options);
  std::string name() const override { return "CosineAnnealingLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  CosineAnnealingLROptions options_;
};

/// Options of CosineAnnealingWarmRestarts.
struct CosineAnnealingWarmRestartsOptions {
  explicit CosineAnnealingWarmRestartsOptions(int64_t T_0) : T_0_(T_0) {}
  /// Steps until the first restart (>= 1).
  TORCH_ARG(int64_t, T_0);
  /// Factor by which the period grows after each restart (>= 1).
  TORCH_ARG(int64_t, T_mult) = 1;
  /// Minimum LR (>= 0).
  TORCH_ARG(double, eta_min) = 0.0;

 public:
  /// The config keys (`[scheduler]` of type CosineAnnealingWarmRestarts): names, rules and help.
  static const OptionBinding<CosineAnnealingWarmRestartsOptions>& binding() {
    static const auto b = OptionBinding<CosineAnnealingWarmRestartsOptions>()
                              .bind(TRAINKIT_OPTION(T_0), rule::integer(1), "Steps to the first restart")
                              .required()
                              .bind(TRAINKIT_OPTION(T_mult), rule::integer(1), "Period growth per restart")
                              .bind(TRAINKIT_OPTION(eta_min), rule::number(non_negative()), "Minimum LR");
    return b;
  }
};

/// lr = eta_min + (base - eta_min)(1 + cos(π·T_cur/T_i))/2, T_cur reset to 0 at each restart and the
/// period T_i multiplied by T_mult.
class CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const CosineAnnealingWarmRestartsOptions& options);
  CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer, CosineAnnealingWarmRestartsOptions options);
  std::string name() const override { return "CosineAnnealingWarmRestarts"; }
  void step() override;

 protected:
  std::vector<double> get_lr() override;
  void save_extra(torch::serialize::OutputArchive& archive) const override;
  void load_extra(torch::serialize::InputArchive& archive) override;

 private:
  CosineAnnealingWarmRestartsOptions options_;
  int64_t T_i_;
  int64_t T_cur_ = -1;
};

/// Options of WarmupCosine.
struct WarmupCosineOptions {
  WarmupCosineOptions(int64_t warmup_steps, int64_t total_steps)
      : warmup_steps_(warmup_steps), total_steps_(total_steps) {}
  /// Steps of linear warmup (>= 0; 0 = pure cosine).
  TORCH_ARG(int64_t, warmup_steps);
  /// Steps until the LR reaches eta_min (> warmup_steps).
  TORCH_ARG(int64_t, total_steps);
  /// Factor of the base LR at step 0 of the warmup (in [0, 1]).
  TORCH_ARG(double, warmup_start_factor) = 0.0;
  /// LR at total_steps and after (>= 0).
  TORCH_ARG(double, eta_min) = 0.0;

 public:
  /// The config keys (`[scheduler]` of type WarmupCosine): names, rules and help.
  static const OptionBinding<WarmupCosineOptions>& binding() {
    static const auto b = OptionBinding<WarmupCosineOptions>()
                              .bind(TRAINKIT_OPTION(warmup_steps), rule::integer(0),
                                    "Steps of linear warmup (0 = pure cosine)")
                              .required()
                              .bind(TRAINKIT_OPTION(total_steps), rule::integer(1),
                                    "Step at which the LR reaches eta_min (flat after); > warmup_steps")
                              .default_text("the run")
                              .bind(TRAINKIT_OPTION(warmup_start_factor), rule::number(closed_unit_interval()),
                                    "Factor of the base LR at step 0")
                              .bind(TRAINKIT_OPTION(eta_min), rule::number(non_negative()), "Final LR");
    return b;
  }
};

/// Linear warmup from base·warmup_start_factor to base over warmup_steps, then
/// eta_min + (base - eta_min)(1 + cos(π·(t - warmup)/(total - warmup)))/2 until total_steps, then eta_min.
class WarmupCosine : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const WarmupCosineOptions& options);
  WarmupCosine(torch::optim::Optimizer& optimizer, WarmupCosineOptions options);
  std::string name() const override { return "WarmupCosine"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  WarmupCosineOptions options_;
};

/// Registers CosineAnnealingLR, CosineAnnealingWarmRestarts and WarmupCosine with the scheduler factory (sched/factory.h); runs once, before main.
bool register_cosine_schedulers();
/// Makes every program that includes this header register them (and link their source).
inline const bool cosine_schedulers_registered = register_cosine_schedulers();

}  // namespace trainkit::sched
