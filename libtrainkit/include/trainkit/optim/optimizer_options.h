#pragma once
/// @file
/// What every optimizer's Options struct is made of: its fields (TORCH_ARG) and, beside them in its header,
/// one OptimizerOptionsBinding, the list that everything else reads: the config keys, their rules and help
/// (the factory, `trainkit train`, docs/config.md), the range checks of the optimizer's constructor, and the
/// state_dict serialization of each param group's options. Adding a flag to an optimizer is its TORCH_ARG and
/// one bind() line (plus the kernel, when the kernel reads it).
///
///     struct LionOptions : OptimizerOptions<LionOptions> {
///       TORCH_ARG(double, lr) = 1e-4;
///       TORCH_ARG(double, weight_decay) = 0;
///       static const OptimizerOptionsBinding<LionOptions>& binding() {
///         static const auto b = OptimizerOptionsBinding<LionOptions>()
///                                   .bind(TRAINKIT_OPTION(lr), non_negative(), "Learning rate")
///                                   .bind(TRAINKIT_OPTION(weight_decay), non_negative(), "Weight decay");
///         return b;
///       }
///     };

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "trainkit/options.h"

namespace trainkit::optim {

/// Help of the `fused` option every trainkit optimizer has.
inline constexpr const char* kFusedDoc =
    "true: the fused kernel, trainkit's on the CPU, ATen's for adam, adamw and sgd on CUDA (or an error); false: "
    "the ATen reference path; unset: fused where possible";
/// Help of the `foreach` option every trainkit optimizer has.
inline constexpr const char* kForeachDoc =
    "true: the multi-tensor ATen path (_foreach_* ops; not with fused = true); unset: on for tensors off the CPU "
    "(CUDA)";
/// Help of the `aten_fused` option of the optimizers that ATen has a fused kernel for.
inline constexpr const char* kAtenFusedDoc =
    "true: ATen's fused kernel (_fused_adam_/_fused_adamw_/_fused_sgd_) on any device (not with foreach = true "
    "or fused = false); unset: on when fused = true and the tensors are off the CPU (CUDA)";

/// The bound fields of an optimizer's `Options`: keys, rules and help (an OptionBinding), requirements that
/// span several fields, and the typed reader and writer of each field for state_dict serialization.
template <class Options>
class OptimizerOptionsBinding {
 public:
  /// Binds a number (double), a pair of numbers (std::tuple<double, double>, each in `range`) or an optional
  /// number (std::optional<double>: a config's 0 means unset, any other value must be in `range`).
  template <class Field>
  OptimizerOptionsBinding& bind(std::string key, Field field, NumberRule range, std::string doc) {
    using T = std::decay_t<decltype(field(std::declval<Options&>()))>;
    if constexpr (std::is_same_v<T, std::tuple<double, double>>) {
      fields_.bind(key, field, rule::number_pair(range), std::move(doc));
    } else if constexpr (std::is_same_v<T, std::optional<double>>) {
      ValueRule<double> number = rule::number(range);
      fields_.bind(key, field,
                   ValueRule<std::optional<double>>{
                       number.type + " or 0 (unset)", number.expected + ", or 0 (unset)",
                       [parse = number.parse, any = rule::number(NumberRule{"number"}).parse](
                           const ArgValue& v) -> std::optional<std::optional<double>> {
                         // 0 in any number form (TOML's 0 or 0.0) is unset.
                         if (const auto x = any(v); x && *x == 0) {
                           return std::optional<double>();
                         }
                         const auto y = parse(v);
                         return y ? std::optional<std::optional<double>>(*y) : std::nullopt;
                       },
                       [](const std::optional<double>& x) { return ArgValue(x.value_or(0.0)); }},
                   std::move(doc));
    } else {
      static_assert(std::is_same_v<T, double>, "bind(key, field, range, doc) takes a number field");
      fields_.bind(key, field, rule::number(range), std::move(doc));
    }
    add_serializer<T>(std::move(key), field);
    return *this;
  }

  /// Binds a boolean (bool) or an optional boolean (std::optional<bool>, unset = the optimizer chooses).
  template <class Field>
  OptimizerOptionsBinding& bind(std::string key, Field field, std::string doc) {
    using T = std::decay_t<decltype(field(std::declval<Options&>()))>;
    static_assert(std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>,
                  "bind(key, field, doc) takes a boolean field");
    fields_.bind(key, field, rule::boolean(), std::move(doc));
    add_serializer<T>(std::move(key), field);
    return *this;
  }

  /// Binds a field of any type its rule reads (an integer: rule::integer(lo, hi); a choice: rule::one_of).
  template <class Field, class T>
  OptimizerOptionsBinding& bind(std::string key, Field field, ValueRule<T> rule, std::string doc) {
    fields_.bind(key, field, std::move(rule), std::move(doc));
    add_serializer<std::decay_t<decltype(field(std::declval<Options&>()))>>(std::move(key), field);
    return *this;
  }

  /// A requirement across fields: `error(options)` says what is wrong, or returns "" when nothing is.
  OptimizerOptionsBinding& require(std::function<std::string(const Options&)> error) {
    requirements_.push_back(std::move(error));
    return *this;
  }

  /// The fields: key, rule, help, reader and printer of each (the factory's arguments).
  const OptionBinding<Options>& fields() const { return fields_; }

  /// Checks every field against its rule, then the requirements; throws ArgError (an std::invalid_argument)
  /// "<optimizer>: <key>: expected <what>, got <value>" or "<optimizer>: <requirement's error>".
  void check(const Options& options, const std::string& optimizer) const {
    check_options(fields_, options, optimizer);
    for (const auto& error : requirements_) {
      const std::string what = error(options);
      if (!what.empty()) {
        throw ArgError(optimizer + ": " + what);
      }
    }
  }

  /// Writes every field under its key (LibTorch's format of a param group's options).
  void save(torch::serialize::OutputArchive& archive, const Options& options) const {
    for (const auto& s : serializers_) {
      s.save(archive, options);
    }
  }
  /// Reads what save() wrote; a key that is absent (state written before the field existed) keeps its value.
  void load(torch::serialize::InputArchive& archive, Options& options) const {
    for (const auto& s : serializers_) {
      s.load(archive, options);
    }
  }

 private:
  struct Serializer {
    std::function<void(torch::serialize::OutputArchive&, const Options&)> save;
    std::function<void(torch::serialize::InputArchive&, Options&)> load;
  };

  template <class T, class Field>
  void add_serializer(std::string key, Field field) {
    Serializer s;
    s.save = [key, field](torch::serialize::OutputArchive& archive, const Options& o) {
      archive.write(key, c10::IValue(field(o)));
    };
    s.load = [key, field](torch::serialize::InputArchive& archive, Options& o) {
      c10::IValue value;
      if (archive.try_read(key, value)) {
        if constexpr (std::is_same_v<T, std::optional<bool>> || std::is_same_v<T, std::optional<double>>) {
          field(o) = value.toOptional<typename T::value_type>();
        } else {
          field(o) = value.to<T>();
        }
      }
    };
    serializers_.push_back(std::move(s));
  }

  OptionBinding<Options> fields_;
  std::vector<std::function<std::string(const Options&)>> requirements_;
  std::vector<Serializer> serializers_;
};

/// Base of an optimizer's Options struct `Derived` (which has TORCH_ARG fields, among them `lr`, and a static
/// `binding()`): cloning, state_dict serialization through the binding, and get_lr/set_lr for schedulers.
/// An `lr` that is not a number (Adafactor's optional one: unset = relative step) has no meaning here:
/// such a Derived overrides get_lr and set_lr.
template <class Derived>
struct OptimizerOptions : public torch::optim::OptimizerCloneableOptions<Derived> {
  void serialize(torch::serialize::InputArchive& archive) override { Derived::binding().load(archive, self()); }
  void serialize(torch::serialize::OutputArchive& archive) const override {
    Derived::binding().save(archive, self());
  }
  double get_lr() const override {
    if constexpr (kNumberLr<Derived>) {
      return self().lr();
    } else {
      throw std::logic_error("an Options type whose lr is not a number overrides get_lr");
    }
  }
  void set_lr(const double lr) override {
    if constexpr (kNumberLr<Derived>) {
      self().lr(lr);
    } else {
      throw std::logic_error("an Options type whose lr is not a number overrides set_lr");
    }
  }

 private:
  template <class D>
  static constexpr bool kNumberLr = std::is_same_v<std::decay_t<decltype(std::declval<const D&>().lr())>, double>;
  Derived& self() { return static_cast<Derived&>(*this); }
  const Derived& self() const { return static_cast<const Derived&>(*this); }
};

}  // namespace trainkit::optim

/// TORCH_ARG for a field of a base that several Options types share (Adam's fields for AdamOptions and
/// AdamWOptions): the setter returns the Options type `Self` (an alias the base declares), so that chained
/// setters keep the derived type: `AdamWOptions(1e-3).weight_decay(0.05)` is an AdamWOptions.
#define TRAINKIT_SHARED_ARG(T, name)                   \
 public:                                               \
  Self& name(const T& new_##name) { /* NOLINT */       \
    this->name##_ = new_##name;                        \
    return static_cast<Self&>(*this);                  \
  }                                                    \
  const T& name() const noexcept { /* NOLINT */        \
    return this->name##_;                              \
  }                                                    \
  T& name() noexcept { /* NOLINT */                    \
    return this->name##_;                              \
  }                                                    \
                                                       \
 private:                                              \
  T name##_ /* NOLINT */
