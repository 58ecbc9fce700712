#pragma once
/// @file
/// Schedulers that multiply the LR by a factor: LambdaLR, MultiplicativeLR, StepLR, MultiStepLR,
/// ConstantLR, LinearLR (warmup), ExponentialLR, PolynomialLR — PyTorch's names, arguments and defaults.

#include <functional>
#include <vector>

#include <torch/arg.h>

#include "trainkit/options.h"
#include "trainkit/sched/scheduler.h"

namespace trainkit::sched {

/// A function of the epoch (last_epoch) returning a factor.
using LrLambda = std::function<double(int64_t)>;

/// lr = base_lr · lr_lambda(epoch); one lambda for all groups or one per group.
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(torch::optim::Optimizer& optimizer, LrLambda lr_lambda);
  /// One lambda per param group.
  LambdaLR(torch::optim::Optimizer& optimizer, std::vector<LrLambda> lr_lambdas);
  std::string name() const override { return "LambdaLR"; }

 protected:
  std::vector<double> get_lr() override;

 private:
  std::vector<LrLambda> lambdas_;
};

/// lr_t = lr_{t-1} · lr_lambda(epoch) (chainable); one lambda for all groups or one per group.
class MultiplicativeLR : public LRScheduler {
 public:
  MultiplicativeLR(torch::optim::Optimizer& optimizer, LrLambda lr_lambda);
  /// One lambda per param group.
  MultiplicativeLR(torch::optim::Optimizer& optimizer, std::vector<LrLambda> lr_lambdas);
  std::string name() const override { return "MultiplicativeLR"; }

 protected:
  std::vector<double> get_lr() override;

 private:
  std::vector<LrLambda> lambdas_;
};

/// Options of StepLR.
struct StepLROptions {
  explicit StepLROptions(int64_t step_size) : step_size_(step_size) {}
  /// Period of LR decay, in steps (>= 1).
  TORCH_ARG(int64_t, step_size);
  /// Multiplicative factor of LR decay (>= 0).
  TORCH_ARG(double, gamma) = 0.1;

 public:
  /// The config keys (`[scheduler]` of type StepLR): names, rules and help.
  static const OptionBinding<StepLROptions>& binding() {
    static const auto b = OptionBinding<StepLROptions>()
                              .bind(TRAINKIT_OPTION(step_size), rule::integer(1), "Decay the LR every this many steps")
                              .required()
                              .bind(TRAINKIT_OPTION(gamma), rule::number(non_negative()), "Decay factor");
    return b;
  }
};

/// lr = base_lr · gamma^⌊epoch / step_size⌋.
class StepLR : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const StepLROptions& options);
  StepLR(torch::optim::Optimizer& optimizer, StepLROptions options);
  std::string name() const override { return "StepLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  StepLROptions options_;
};

/// Options of MultiStepLR.
struct MultiStepLROptions {
  explicit MultiStepLROptions(std::vector<int64_t> milestones) : milestones_(std::move(milestones)) {}
  /// Epochs at which the LR is multiplied by gamma (a repeated milestone multiplies repeatedly).
  TORCH_ARG(std::vector<int64_t>, milestones);
  /// Multiplicative factor (>= 0).
  TORCH_ARG(double, gamma) = 0.1;

 public:
  /// The config keys (`[scheduler]` of type MultiStepLR): names, rules and help.
  static const OptionBinding<MultiStepLROptions>& binding() {
    static const auto b = OptionBinding<MultiStepLROptions>()
                              .bind(TRAINKIT_OPTION(milestones), rule::integers(0),
                                    "Steps at which the LR decays (a repeated step decays twice)")
                              .required()
                              .bind(TRAINKIT_OPTION(gamma), rule::number(non_negative()), "Decay factor");
    return b;
  }
};

/// lr = base_lr · gamma^(number of milestones <= epoch).
class MultiStepLR : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const MultiStepLROptions& options);
  MultiStepLR(torch::optim::Optimizer& optimizer, MultiStepLROptions options);
  std::string name() const override { return "MultiStepLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  MultiStepLROptions options_;
};

/// Options of ConstantLR.
struct ConstantLROptions {
  /// Factor applied until total_iters (in [0, 1]).
  TORCH_ARG(double, factor) = 1.0 / 3;
  /// Steps with the reduced LR (>= 0).
  TORCH_ARG(int64_t, total_iters) = 5;

 public:
  /// The config keys (`[scheduler]` of type ConstantLR): names, rules and help.
  static const OptionBinding<ConstantLROptions>& binding() {
    static const auto b = OptionBinding<ConstantLROptions>()
                              .bind(TRAINKIT_OPTION(factor), rule::number(closed_unit_interval()),
                                    "Factor of the LR until total_iters")
                              .bind(TRAINKIT_OPTION(total_iters), rule::integer(0), "Steps at the reduced LR");
    return b;
  }
};

/// lr = base_lr · factor for epoch < total_iters, then base_lr.
class ConstantLR : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const ConstantLROptions& options);
  ConstantLR(torch::optim::Optimizer& optimizer, ConstantLROptions options = {});
  std::string name() const override { return "ConstantLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  ConstantLROptions options_;
};

/// Options of LinearLR.
struct LinearLROptions {
  /// Factor at epoch 0 (in (0, 1]).
  TORCH_ARG(double, start_factor) = 1.0 / 3;
  /// Factor from total_iters on (in [0, 1]).
  TORCH_ARG(double, end_factor) = 1.0;
  /// Steps of the linear ramp (>= 1).
  TORCH_ARG(int64_t, total_iters) = 5;

 public:
  /// The config keys (`[scheduler]` of type LinearLR): names, rules and help.
  static const OptionBinding<LinearLROptions>& binding() {
    static const auto b = OptionBinding<LinearLROptions>()
                              .bind(TRAINKIT_OPTION(start_factor), rule::number({"number in (0, 1]", 0.0, true, 1.0}),
                                    "Factor of the LR at step 0")
                              .bind(TRAINKIT_OPTION(end_factor), rule::number(closed_unit_interval()),
                                    "Factor of the LR from total_iters on")
                              .bind(TRAINKIT_OPTION(total_iters), rule::integer(1), "Steps of the linear change");
    return b;
  }
};

/// Linear warmup (or decay): lr = base_lr · (start + (end - start) · min(epoch, total_iters) / total_iters).
class LinearLR : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const LinearLROptions& options);
  LinearLR(torch::optim::Optimizer& optimizer, LinearLROptions options = {});
  std::string name() const override { return "LinearLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  LinearLROptions options_;
};

/// Options of ExponentialLR.
struct ExponentialLROptions {
  explicit ExponentialLROptions(double gamma) : gamma_(gamma) {}
  /// Multiplicative factor per step (>= 0).
  TORCH_ARG(double, gamma);

 public:
  /// The config keys (`[scheduler]` of type ExponentialLR): names, rules and help.
  static const OptionBinding<ExponentialLROptions>& binding() {
    static const auto b = OptionBinding<ExponentialLROptions>()
                              .bind(TRAINKIT_OPTION(gamma), rule::number(non_negative()), "Factor per step")
                              .required();
    return b;
  }
};

/// lr = base_lr · gamma^epoch.
class ExponentialLR : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const ExponentialLROptions& options);
  ExponentialLR(torch::optim::Optimizer& optimizer, ExponentialLROptions options);
  std::string name() const override { return "ExponentialLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  ExponentialLROptions options_;
};

/// Options of PolynomialLR.
struct PolynomialLROptions {
  /// Steps until the LR reaches 0 (>= 1).
  TORCH_ARG(int64_t, total_iters) = 5;
  /// Power of the polynomial (finite).
  TORCH_ARG(double, power) = 1.0;

 public:
  /// The config keys (`[scheduler]` of type PolynomialLR): names, rules and help.
  static const OptionBinding<PolynomialLROptions>& binding() {
    static const auto b = OptionBinding<PolynomialLROptions>()
                              .bind(TRAINKIT_OPTION(total_iters), rule::integer(1), "Steps until the LR reaches 0")
                              .bind(TRAINKIT_OPTION(power), rule::number({"number"}), "Power of the decay");
    return b;
  }
};

/// lr = base_lr · (1 - min(epoch, total_iters) / total_iters)^power.
class PolynomialLR : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const PolynomialLROptions& options);
  PolynomialLR(torch::optim::Optimizer& optimizer, PolynomialLROptions options = {});
  std::string name() const override { return "PolynomialLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  PolynomialLROptions options_;
};

/// Registers StepLR, MultiStepLR, ConstantLR, LinearLR, ExponentialLR and PolynomialLR (LambdaLR and MultiplicativeLR
/// as types that name why they cannot come from a config) with the scheduler factory (sched/factory.h); runs once, before main.
bool register_factor_schedulers();
/// Makes every program that includes this header register them (and link their source).
inline const bool factor_schedulers_registered = register_factor_schedulers();

}  // namespace trainkit::sched
