#pragma once
/// @file
/// The schedules of current LLM recipes, which PyTorch has no class for: WarmupStableDecay (warmup, a constant
/// LR, then a short decay; Hu et al. 2024, MiniCPM, arXiv 2404.06395; the 1-sqrt decay from Hägele et al.
/// 2024, arXiv 2405.18392) and InverseSqrt (warmup, then base·√(timescale/t); Vaswani et al. 2017, arXiv
/// 1706.03762). Argument names and semantics are those of Hugging Face transformers' `get_wsd_schedule` and
/// `get_inverse_sqrt_schedule`.

#include <optional>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "trainkit/options.h"
#include "trainkit/sched/scheduler.h"

namespace trainkit::sched {

/// Options of WarmupStableDecay. The decay length is num_decay_steps or decay_ratio·num_training_steps (one
/// of the two); the stable length is num_stable_steps or num_training_steps − warmup − decay (one of the two).
struct WarmupStableDecayOptions {
  explicit WarmupStableDecayOptions(int64_t num_warmup_steps) : num_warmup_steps_(num_warmup_steps) {}
  /// Steps of warmup from base·min_lr_ratio to base (>= 0).
  TORCH_ARG(int64_t, num_warmup_steps);
  /// Steps of decay from base to base·min_lr_ratio (>= 0); or give decay_ratio.
  TORCH_ARG(std::optional<int64_t>, num_decay_steps);
  /// The decay as a fraction of num_training_steps (in [0, 1]), rounded to the nearest step.
  TORCH_ARG(std::optional<double>, decay_ratio);
  /// Warmup + stable + decay (>= 1); or give num_stable_steps.
  TORCH_ARG(std::optional<int64_t>, num_training_steps);
  /// Steps at the base LR between warmup and decay (>= 0).
  TORCH_ARG(std::optional<int64_t>, num_stable_steps);
  /// Shape of the warmup: "linear", "cosine" or "1-sqrt".
  TORCH_ARG(std::string, warmup_type) = "linear";
  /// Shape of the decay: "linear", "cosine" or "1-sqrt".
  TORCH_ARG(std::string, decay_type) = "cosine";
  /// LR at the start of the warmup and from the end of the decay on, as a fraction of the base LR (in [0, 1]).
  TORCH_ARG(double, min_lr_ratio) = 0.0;
  /// Cosine periods over the decay (> 0; 0.5 = one half wave from base to the minimum).
  TORCH_ARG(double, num_cycles) = 0.5;

 public:
  /// The config keys (`[scheduler]` of type WarmupStableDecay): names, rules and help.
  static const OptionBinding<WarmupStableDecayOptions>& binding() {
    static const std::vector<std::string> shapes = {"linear", "cosine", "1-sqrt"};
    static const auto b =
        OptionBinding<WarmupStableDecayOptions>()
            .bind(TRAINKIT_OPTION(num_warmup_steps), rule::integer(0), "Steps of warmup from base x min_lr_ratio")
            .required()
            .bind(TRAINKIT_OPTION(num_decay_steps), rule::integer(0), "Steps of decay to base x min_lr_ratio")
            .default_text("or decay_ratio")
            .bind(TRAINKIT_OPTION(decay_ratio), rule::number(closed_unit_interval()),
                  "Decay steps as a fraction of num_training_steps (rounded)")
            .default_text("or num_decay_steps")
            .bind(TRAINKIT_OPTION(num_training_steps), rule::integer(1), "Warmup + stable + decay steps")
            .default_text("the run")
            .bind(TRAINKIT_OPTION(num_stable_steps), rule::integer(0),
                  "Steps at the base LR (instead of num_training_steps)")
            .default_text("the rest")
            .bind(TRAINKIT_OPTION(warmup_type), rule::one_of(shapes), "Shape of the warmup")
            .bind(TRAINKIT_OPTION(decay_type), rule::one_of(shapes), "Shape of the decay")
            .bind(TRAINKIT_OPTION(min_lr_ratio), rule::number(closed_unit_interval()),
                  "First and final LR as a fraction of the base LR")
            .bind(TRAINKIT_OPTION(num_cycles), rule::number(positive()), "Cosine periods over the decay");
    return b;
  }
};

/// lr = base·f(t), with W warmup, S stable and D decay steps and m = min_lr_ratio:
///   t < W:          p = t/W,           f = m + (1 − m)·w(p),  w = p | (1 − cos πp)/2 | 1 − √(1 − p)
///   t < W + S:      f = 1
///   t < W + S + D:  p = (t − W − S)/D, f = m + (1 − m)·d(p),  d = 1 − p | (1 + cos 2π·num_cycles·p)/2 | 1 − √p
///   later:          f = m
/// for the shapes linear | cosine | 1-sqrt, as transformers' get_wsd_schedule. No state beyond the step count.
class WarmupStableDecay : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const WarmupStableDecayOptions& options);
  WarmupStableDecay(torch::optim::Optimizer& optimizer, WarmupStableDecayOptions options);
  std::string name() const override { return "WarmupStableDecay"; }
  /// Stable steps, as given or derived from num_training_steps.
  int64_t num_stable_steps() const { return stable_; }
  /// Decay steps, as given or derived from decay_ratio.
  int64_t num_decay_steps() const { return decay_; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  WarmupStableDecayOptions options_;
  int64_t decay_ = 0;
  int64_t stable_ = 0;
};

/// Options of InverseSqrt.
struct InverseSqrtOptions {
  explicit InverseSqrtOptions(int64_t num_warmup_steps) : num_warmup_steps_(num_warmup_steps) {}
  /// Steps of linear warmup from 0 to the base LR (>= 0).
  TORCH_ARG(int64_t, num_warmup_steps);
  /// Time scale T of the decay, lr = base·√(T/(t + T − num_warmup_steps)) (>= 1); unset: num_warmup_steps,
  /// or 10000 without warmup.
  TORCH_ARG(std::optional<int64_t>, timescale);

 public:
  /// The config keys (`[scheduler]` of type InverseSqrt): names, rules and help.
  static const OptionBinding<InverseSqrtOptions>& binding() {
    static const auto b =
        OptionBinding<InverseSqrtOptions>()
            .bind(TRAINKIT_OPTION(num_warmup_steps), rule::integer(0), "Steps of linear warmup from 0")
            .required()
            .bind(TRAINKIT_OPTION(timescale), rule::integer(1),
                  "Decay time scale: lr = base x sqrt(timescale / (t + timescale - warmup))")
            .default_text("num_warmup_steps, or 10000 if 0");
    return b;
  }
};

/// lr = base·t/W for t < W, then base·√(T/(t + T − W)) (= base·√(W/t) with the default T = W), as
/// transformers' get_inverse_sqrt_schedule; T = timescale, W = num_warmup_steps.
class InverseSqrt : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer.
  static void validate(const InverseSqrtOptions& options);
  InverseSqrt(torch::optim::Optimizer& optimizer, InverseSqrtOptions options);
  std::string name() const override { return "InverseSqrt"; }
  /// The time scale in use (the option, or its default).
  int64_t timescale() const;

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  InverseSqrtOptions options_;
};

/// Registers WarmupStableDecay and InverseSqrt with the scheduler factory (sched/factory.h); runs once, before
/// main.
bool register_warmup_decay_schedulers();
/// Makes every program that includes this header register them (and link their source).
inline const bool warmup_decay_schedulers_registered = register_warmup_decay_schedulers();

}  // namespace trainkit::sched
