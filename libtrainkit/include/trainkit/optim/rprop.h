#pragma once
/// @file
/// Rprop (resilient backpropagation) written from scratch on LibTorch tensors (reference and foreach
/// paths); same numbers as torch.optim.Rprop (Riedmiller & Braun 1993, "A Direct Adaptive Method for Faster
/// Backpropagation Learning: The RPROP Algorithm", IEEE ICNN).

#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/optim/optimizer_base.h"
#include "trainkit/optim/optimizer_options.h"

namespace trainkit::optim {

/// Options of Rprop (PyTorch's names and defaults). Also the options of one param group.
struct RpropOptions : public OptimizerOptions<RpropOptions> {
  using pair_t = std::tuple<double, double>;
  RpropOptions() = default;
  /// Options with learning rate `lr`.
  RpropOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor)
  /// Initial step size of every element (>= 0).
  TORCH_ARG(double, lr) = 1e-2;
  /// (etaminus, etaplus): the step-size factors when the gradient's sign flips / stays, 0 < etaminus < 1 < etaplus.
  TORCH_ARG(pair_t, etas) = std::make_tuple(0.5, 1.2);
  /// (min, max) step size, 0 <= min <= max.
  TORCH_ARG(pair_t, step_sizes) = std::make_tuple(1e-6, 50.0);
  /// Maximize the objective instead of minimizing it.
  TORCH_ARG(bool, maximize) = false;
  /// Multi-tensor ATen path (`_foreach_*` ops, as PyTorch's `foreach=True`): unset = on for tensors that
  /// are not on the CPU (CUDA); true = always. There is no fused CPU kernel: otherwise the reference path.
  TORCH_ARG(std::optional<bool>, foreach) = std::nullopt;

 public:
  /// A pair of finite numbers (lo, hi) for which `ok(lo, hi)` holds, described by `what`: one key's own
  /// rule, so that the config names the key of a pair it rejects.
  static ValueRule<pair_t> ordered_pair(const std::string& what, bool (*ok)(double, double)) {
    ValueRule<pair_t> r = rule::number_pair({"number", -std::numeric_limits<double>::infinity()});
    r.type = "[number, number] with " + what;
    r.expected = "an array of two numbers with " + what;
    r.parse = [parse = r.parse, ok](const ArgValue& v) -> std::optional<pair_t> {
      const auto x = parse(v);
      return x && ok(std::get<0>(*x), std::get<1>(*x)) ? x : std::nullopt;
    };
    return r;
  }
  /// The fields' keys, rules and help (the factory's "rprop" arguments), checks and serialization.
  static const OptimizerOptionsBinding<RpropOptions>& binding() {
    static const auto b =
        OptimizerOptionsBinding<RpropOptions>()
            .bind(TRAINKIT_OPTION(lr), non_negative(), "Learning rate: the initial step size")
            .bind(TRAINKIT_OPTION(etas),
                  ordered_pair("0 < etaminus < 1 < etaplus", [](double lo, double hi) { return lo > 0 && lo < 1 && hi > 1; }),
                  "(etaminus, etaplus): step-size factors on a sign flip / no flip")
            .bind(TRAINKIT_OPTION(step_sizes), ordered_pair("0 <= min <= max", [](double lo, double hi) { return lo >= 0 && lo <= hi; }),
                  "(min, max) step size")
            .bind(TRAINKIT_OPTION(maximize), "Maximize the objective instead of minimizing it")
            .bind(TRAINKIT_OPTION(foreach), kForeachDoc);
    return b;
  }
};

/// Per-parameter state of Rprop (PyTorch's state_dict names).
struct RpropParamState : public torch::optim::OptimizerCloneableParamState<RpropParamState> {
  /// Steps taken for this parameter.
  TORCH_ARG(int64_t, step) = 0;
  /// The previous step's gradient (0 where its sign flipped).
  TORCH_ARG(at::Tensor, prev);
  /// Per-element step size, from lr.
  TORCH_ARG(at::Tensor, step_size);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Rprop: s = sign(g·prev); step_size ← clamp(step_size·(s > 0 ? etaplus : s < 0 ? etaminus : 1), min, max);
/// g ← 0 where s < 0; p ← p - sign(g)·step_size; prev ← g. Parameters without a gradient are skipped.
class Rprop : public OptimizerBase<Rprop, RpropOptions, RpropParamState> {
 public:
  /// Name in messages.
  static constexpr const char* kName = "Rprop";
  /// From params or param groups (which may carry their own RpropOptions).
  using OptimizerBase::OptimizerBase;

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale);
};

/// Registers "rprop" with the optimizer factory (trainkit/optim/factory.h); defined beside the optimizer.
bool register_rprop_optimizer();
namespace internal {
/// Registers wherever this header is linked in, so the factory always knows the optimizer.
inline const bool rprop_registered = register_rprop_optimizer();
}  // namespace internal

}  // namespace trainkit::optim
