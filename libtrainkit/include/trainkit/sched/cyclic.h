#pragma once
/// @file
/// Cyclical schedules with momentum cycling: CyclicLR (Smith 2017, arXiv 1506.01186) and OneCycleLR
/// (Smith & Topin 2018, arXiv 1708.07120), PyTorch's arguments and defaults.

#include <array>
#include <functional>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "trainkit/optim/cyclable_momentum.h"
#include "trainkit/options.h"
#include "trainkit/sched/scheduler.h"

namespace trainkit::sched {

/// The momentum interface optimizers implement (defined in optim; this alias keeps sched:: spellings).
using optim::CyclableMomentum;

/// True when the options of `group` have a momentum (or beta1) that can be cycled.
bool has_cyclable_momentum(const torch::optim::OptimizerParamGroup& group);
/// The cyclable momentum (SGD/RMSprop momentum, Adam/AdamW beta1, or CyclableMomentum).
double get_cyclable_momentum(const torch::optim::OptimizerParamGroup& group);
/// Sets it.
void set_cyclable_momentum(torch::optim::OptimizerParamGroup& group, double momentum);

/// Options of CyclicLR. Per-group values: give one per param group, or one for all.
struct CyclicLROptions {
  CyclicLROptions(std::vector<double> base_lr, std::vector<double> max_lr)
      : base_lr_(std::move(base_lr)), max_lr_(std::move(max_lr)) {}
  /// Lower LR boundary (one value, or one per group).
  TORCH_ARG(std::vector<double>, base_lr);
  /// Upper LR boundary (one value, or one per group).
  TORCH_ARG(std::vector<double>, max_lr);
  /// Steps of the increasing half (>= 1).
  TORCH_ARG(int64_t, step_size_up) = 2000;
  /// Steps of the decreasing half (0 = same as step_size_up).
  TORCH_ARG(int64_t, step_size_down) = 0;
  /// "triangular", "triangular2" or "exp_range" (ignored when scale_fn is set).
  TORCH_ARG(std::string, mode) = "triangular";
  /// exp_range: amplitude scale gamma^iterations.
  TORCH_ARG(double, gamma) = 1.0;
  /// Custom amplitude scale; replaces mode.
  TORCH_ARG(std::function<double(double)>, scale_fn) = nullptr;
  /// With scale_fn: "cycle" (argument: cycle number) or "iterations" (argument: step).
  TORCH_ARG(std::string, scale_mode) = "cycle";
  /// Cycle momentum (or beta1) inversely to the LR between base_momentum and max_momentum.
  TORCH_ARG(bool, cycle_momentum) = true;
  /// Lower momentum boundary (one value, or one per group).
  TORCH_ARG(std::vector<double>, base_momentum) = std::vector<double>{0.8};
  /// Upper momentum boundary (one value, or one per group).
  TORCH_ARG(std::vector<double>, max_momentum) = std::vector<double>{0.9};

 public:
  /// The config keys (`[scheduler]` of type CyclicLR): names, rules and help (scale_fn and scale_mode are
  /// C++ only).
  static const OptionBinding<CyclicLROptions>& binding() {
    static const auto b =
        OptionBinding<CyclicLROptions>()
            .bind(TRAINKIT_OPTION(base_lr), rule::numbers(non_negative()), "Lower LR bound")
            .required()
            .bind(TRAINKIT_OPTION(max_lr), rule::numbers(non_negative()), "Upper LR bound (>= base_lr)")
            .required()
            .bind(TRAINKIT_OPTION(step_size_up), rule::integer(1), "Steps of the rising half")
            .bind(TRAINKIT_OPTION(step_size_down), rule::integer(0), "Steps of the falling half (0 = step_size_up)")
            .bind(TRAINKIT_OPTION(mode), rule::one_of({"triangular", "triangular2", "exp_range"}), "Amplitude policy")
            .bind(TRAINKIT_OPTION(gamma), rule::number(positive()), "exp_range: amplitude x gamma^step")
            .bind(TRAINKIT_OPTION(cycle_momentum), rule::boolean(),
                  "Cycle SGD momentum / Adam beta1 inversely to the LR")
            .bind(TRAINKIT_OPTION(base_momentum), rule::numbers(non_negative()), "Lower momentum bound")
            .bind(TRAINKIT_OPTION(max_momentum), rule::numbers(non_negative()), "Upper momentum bound");
    return b;
  }
};

/// Cyclical LR between base_lr and max_lr with a triangle wave, optionally scaled per cycle or step.
class CyclicLR : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const CyclicLROptions& options);
  CyclicLR(torch::optim::Optimizer& optimizer, CyclicLROptions options);
  std::string name() const override { return "CyclicLR"; }

 protected:
  std::vector<double> get_lr() override;

 private:
  double scale(double x) const;
  CyclicLROptions options_;
  std::vector<double> max_lrs_;
  std::vector<double> base_momentums_;
  std::vector<double> max_momentums_;
  double total_size_;
  double step_ratio_;
  bool scale_by_cycle_;
};

/// Options of OneCycleLR.
struct OneCycleLROptions {
  explicit OneCycleLROptions(std::vector<double> max_lr) : max_lr_(std::move(max_lr)) {}
  /// Peak LR (one value, or one per group).
  TORCH_ARG(std::vector<double>, max_lr);
  /// Steps in the cycle; 0 = epochs · steps_per_epoch.
  TORCH_ARG(int64_t, total_steps) = 0;
  /// With steps_per_epoch, defines total_steps when it is 0.
  TORCH_ARG(int64_t, epochs) = 0;
  /// See epochs.
  TORCH_ARG(int64_t, steps_per_epoch) = 0;
  /// Fraction of the cycle spent increasing the LR (in [0, 1]).
  TORCH_ARG(double, pct_start) = 0.3;
  /// "cos" or "linear".
  TORCH_ARG(std::string, anneal_strategy) = "cos";
  /// Cycle momentum (or beta1) inversely to the LR.
  TORCH_ARG(bool, cycle_momentum) = true;
  /// Lower momentum boundary (one value, or one per group).
  TORCH_ARG(std::vector<double>, base_momentum) = std::vector<double>{0.85};
  /// Upper momentum boundary (one value, or one per group).
  TORCH_ARG(std::vector<double>, max_momentum) = std::vector<double>{0.95};
  /// initial_lr = max_lr / div_factor.
  TORCH_ARG(double, div_factor) = 25.0;
  /// min_lr = initial_lr / final_div_factor.
  TORCH_ARG(double, final_div_factor) = 1e4;
  /// Three phases (up, down to initial_lr, annihilate) instead of two.
  TORCH_ARG(bool, three_phase) = false;

 public:
  /// The config keys (`[scheduler]` of type OneCycleLR): names, rules and help.
  static const OptionBinding<OneCycleLROptions>& binding() {
    static const auto b =
        OptionBinding<OneCycleLROptions>()
            .bind(TRAINKIT_OPTION(max_lr), rule::numbers(positive()), "Peak LR")
            .required()
            .bind(TRAINKIT_OPTION(total_steps), rule::integer(0),
                  "Cycle length (0: epochs x steps_per_epoch; neither given: the run)")
            .default_text("the run")
            .bind(TRAINKIT_OPTION(epochs), rule::integer(0), "With steps_per_epoch: the cycle length")
            .bind(TRAINKIT_OPTION(steps_per_epoch), rule::integer(0), "With epochs: the cycle length")
            .bind(TRAINKIT_OPTION(pct_start), rule::number(closed_unit_interval()), "Fraction of the cycle rising")
            .bind(TRAINKIT_OPTION(anneal_strategy), rule::one_of({"cos", "linear"}), "Annealing shape")
            .bind(TRAINKIT_OPTION(cycle_momentum), rule::boolean(), "Cycle momentum / beta1 inversely to the LR")
            .bind(TRAINKIT_OPTION(base_momentum), rule::numbers(non_negative()), "Lower momentum bound")
            .bind(TRAINKIT_OPTION(max_momentum), rule::numbers(non_negative()), "Upper momentum bound")
            .bind(TRAINKIT_OPTION(div_factor), rule::number(positive()), "initial_lr = max_lr / div_factor")
            .bind(TRAINKIT_OPTION(final_div_factor), rule::number(positive()), "min_lr = initial_lr / final_div_factor")
            .bind(TRAINKIT_OPTION(three_phase), rule::boolean(), "Rise, fall to initial_lr, then annihilate");
    return b;
  }
};

/// The 1cycle policy: initial_lr → max_lr → min_lr with momentum cycling inversely. Stepping past
/// total_steps throws std::invalid_argument.
class OneCycleLR : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const OneCycleLROptions& options);
  OneCycleLR(torch::optim::Optimizer& optimizer, OneCycleLROptions options);
  std::string name() const override { return "OneCycleLR"; }
  /// Steps in the cycle.
  int64_t total_steps() const { return total_steps_; }

 protected:
  std::vector<double> get_lr() override;

 private:
  struct Phase {
    double end_step;
    int start_lr, end_lr, start_momentum, end_momentum;  // indices into a group's value table
  };
  OneCycleLROptions options_;
  int64_t total_steps_;
  std::vector<Phase> phases_;
  // Per group: {initial_lr, max_lr, min_lr, max_momentum, base_momentum} (PyTorch keeps them in the group).
  std::vector<std::array<double, 5>> values_;
};

/// Registers CyclicLR and OneCycleLR with the scheduler factory (sched/factory.h); runs once, before main.
bool register_cyclic_schedulers();
/// Makes every program that includes this header register them (and link their source).
inline const bool cyclic_schedulers_registered = register_cyclic_schedulers();

}  // namespace trainkit::sched
