#pragma once
/// @file
/// The optimizer registry and factory: an optimizer chosen by name with named arguments (PyTorch's and
/// timm's names and defaults: `lr`, `betas`, `momentum`, `trust_coefficient` ...), read from any ArgTable.
/// Each optimizer registers once, binding argument names to its Options fields (see OptimizerBinding);
/// the same table serves parsing, printing the effective values and documentation.
///
///     ArgReader args(table, "train.toml: [optimizer]");
///     const OptimizerSpec spec = parse_optimizer("lars", args);     // read, checked, defaults filled
///     auto optimizer = make_optimizer(spec, model->parameters());

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include "trainkit/args.h"
#include "trainkit/optim/param_groups.h"

namespace trainkit::optim {

/// An optimizer chosen by name with every argument resolved (defaults filled in); builds no optimizer.
struct OptimizerSpec {
  /// Registered name: "adam", "adamw", "sgd", "lars", "lamb" or one a user registered.
  std::string name;
  /// The optimizer's own Options type (AdamOptions ...) with every value set.
  std::shared_ptr<torch::optim::OptimizerOptions> options;
  /// Parameters with ndim <= 1 (biases, norm weights) go into a group with weight_decay 0
  /// (weight_decay_param_groups).
  bool no_decay_1d = false;
};

/// Reads the arguments of optimizer `name` from `args` (every key not read before must be one of its
/// arguments, or `no_decay_1d`), checks them and fills the others with the optimizer's defaults; calls
/// args.finish(). `section` is the table's name in messages: "<where>: optimizer.lr: expected ...".
/// Throws ArgError for an unknown optimizer, an unknown key, a key of another optimizer, a value of the
/// wrong type or out of range, or options the optimizer's validate() rejects.
OptimizerSpec parse_optimizer(const std::string& name, ArgReader& args, const std::string& section = "optimizer");

/// The optimizer of `spec` over `params`: one param group, or the no-decay split when spec.no_decay_1d.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<at::Tensor>& params);
/// The optimizer of `spec` over param groups that carry their own options (of the same Options type);
/// spec.options are the defaults, spec.no_decay_1d is not applied.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<torch::optim::OptimizerParamGroup>& groups);

/// The effective value of every argument of spec's optimizer (unset optional ones left out), in
/// binding order, then `no_decay_1d`: what a run's config.toml records.
ArgTable optimizer_args(const OptimizerSpec& spec);

/// The registered optimizer names, sorted.
std::vector<std::string> optimizer_names();

/// One argument name across all optimizers: its type, its meaning, and which optimizers take it.
struct OptimizerArgDoc {
  /// Argument name ("lr").
  std::string name;
  /// Type and range as text ("number > 0").
  std::string type;
  /// Meaning; where optimizers bind it with different meanings, each meaning after the optimizers it is
  /// theirs ("adam, sgd: L2 penalty ...; adamw: decoupled weight decay ...").
  std::string doc;
  /// Optimizers that take it, sorted.
  std::vector<std::string> optimizers;
  /// The default, when every optimizer that takes it has the same one (else the optimizer's own).
  std::optional<ArgValue> default_value;
};
/// Every argument name once (in binding order, optimizers taken by name), then `no_decay_1d`.
std::vector<OptimizerArgDoc> optimizer_arg_docs();

/// One bound argument of one optimizer, type-erased (OptimizerBinding writes these).
struct OptimizerArg {
  /// Argument name ("betas").
  std::string name;
  /// Type and range for docs ("[number, number] in [0, 1)").
  std::string type;
  /// What a message says was expected ("an array of two numbers in [0, 1)").
  std::string expected;
  /// Meaning, one line.
  std::string doc;
  /// Stores `value` into `options` (of the optimizer's Options type); false when the value does not fit.
  std::function<bool(const ArgValue& value, torch::optim::OptimizerOptions& options)> read;
  /// The value held in `options`; nullopt when unset (an optional option).
  std::function<std::optional<ArgValue>(const torch::optim::OptimizerOptions& options)> show;
};

/// What the factory knows of one optimizer.
struct OptimizerEntry {
  /// Name ("adam").
  std::string name;
  /// Its arguments, in the order they are documented and printed.
  std::vector<OptimizerArg> args;
  /// Fresh options holding the defaults.
  std::function<std::shared_ptr<torch::optim::OptimizerOptions>()> defaults;
  /// Throws std::invalid_argument when the options are invalid as a whole (the optimizer's own check).
  std::function<void(const torch::optim::OptimizerOptions& options)> validate;
  /// The optimizer over `groups` with `defaults`.
  std::function<std::unique_ptr<torch::optim::Optimizer>(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                                         const torch::optim::OptimizerOptions& defaults)>
      make;
  /// `params` split by weight_decay_param_groups with `options`.
  std::function<std::vector<torch::optim::OptimizerParamGroup>(const std::vector<at::Tensor>& params,
                                                               const torch::optim::OptimizerOptions& options)>
      no_decay_groups;
};

/// Adds an optimizer to the factory. Throws std::invalid_argument when the name is taken.
void register_optimizer(OptimizerEntry entry);

/// A range of numeric argument values and its text ("number > 0").
struct NumberRule {
  /// How docs and messages describe the range.
  std::string text;
  /// Lower bound.
  double lo = -std::numeric_limits<double>::infinity();
  /// True: x > lo; false: x >= lo.
  bool lo_open = false;
  /// Upper bound.
  double hi = std::numeric_limits<double>::infinity();
  /// True: x < hi; false: x <= hi.
  bool hi_open = false;
  /// True when `x` is finite and in the range.
  bool allows(double x) const {
    return std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
};
/// x > 0.
inline NumberRule positive() { return {"number > 0", 0.0, true}; }
/// x >= 0.
inline NumberRule non_negative() { return {"number >= 0", 0.0, false}; }
/// 0 <= x < 1.
inline NumberRule unit_interval() { return {"number in [0, 1)", 0.0, false, 1.0, true}; }

/// `"lr", [](auto& o) -> auto& { return o.lr(); }`: an Options field by its TORCH_ARG name, for bind().
#define TRAINKIT_OPTION(field) #field, [](auto& o) -> auto& { return o.field(); }

/// Writes the OptimizerEntry of optimizer class `Opt` (which has `Opt::options_type`, a constructor from
/// (param groups, options) and a static `validate(const Options&)`, as every OptimizerBase subclass does):
///
///     register_optimizer(OptimizerBinding<Sgd>("sgd")
///                            .bind(TRAINKIT_OPTION(lr), positive(), "Learning rate")
///                            .bind(TRAINKIT_OPTION(nesterov), "Nesterov momentum")
///                            .entry());
template <class Opt>
class OptimizerBinding {
 public:
  /// The optimizer's options type.
  using Options = typename Opt::options_type;

  /// An entry named `name` with no arguments yet.
  explicit OptimizerBinding(std::string name) {
    entry_.name = std::move(name);
    entry_.defaults = [] { return std::make_shared<Options>(); };
    entry_.validate = [](const torch::optim::OptimizerOptions& o) { Opt::validate(cast(o)); };
    entry_.make = [](const std::vector<torch::optim::OptimizerParamGroup>& groups,
                     const torch::optim::OptimizerOptions& defaults) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<Opt>(groups, cast(defaults));
    };
    entry_.no_decay_groups = [](const std::vector<at::Tensor>& params, const torch::optim::OptimizerOptions& o) {
      return weight_decay_param_groups(params, cast(o));
    };
  }

  /// Binds a number (double), a pair of numbers (std::tuple<double, double>, each in `rule`) or an optional
  /// number (std::optional<double>, where 0 means unset) to `key`.
  template <class Field>
  OptimizerBinding& bind(std::string key, Field field, NumberRule rule, std::string doc) {
    using T = std::decay_t<decltype(field(std::declval<Options&>()))>;
    OptimizerArg arg;
    arg.name = std::move(key);
    arg.doc = std::move(doc);
    if constexpr (std::is_same_v<T, double>) {
      arg.type = rule.text;
      arg.expected = "a " + rule.text;
      arg.read = [field, rule](const ArgValue& v, torch::optim::OptimizerOptions& o) {
        const auto x = number_in(v, rule);
        if (x) {
          field(cast(o)) = *x;
        }
        return x.has_value();
      };
      arg.show = [field](const torch::optim::OptimizerOptions& o) -> std::optional<ArgValue> {
        return ArgValue(field(cast(o)));
      };
    } else if constexpr (std::is_same_v<T, std::tuple<double, double>>) {
      const std::string range = rule.text.substr(rule.text.find(' ') + 1);  // "in [0, 1)"
      arg.type = "[number, number] " + range;
      arg.expected = "an array of two numbers " + range;
      arg.read = [field, rule](const ArgValue& v, torch::optim::OptimizerOptions& o) {
        const auto* a = v.get_if<ArgValue::Array>();
        if (a == nullptr || a->size() != 2) {
          return false;
        }
        const auto x = number_in((*a)[0], rule);
        const auto y = number_in((*a)[1], rule);
        if (!x || !y) {
          return false;
        }
        field(cast(o)) = std::make_tuple(*x, *y);
        return true;
      };
      arg.show = [field](const torch::optim::OptimizerOptions& o) -> std::optional<ArgValue> {
        const auto& [x, y] = field(cast(o));
        return ArgValue(ArgValue::Array{ArgValue(x), ArgValue(y)});
      };
    } else {
      static_assert(std::is_same_v<T, std::optional<double>>, "bind(key, field, rule, doc) takes a number field");
      arg.type = rule.text;
      arg.expected = "a " + rule.text;
      arg.read = [field, rule](const ArgValue& v, torch::optim::OptimizerOptions& o) {
        const auto x = number_in(v, rule);
        if (x) {
          field(cast(o)) = *x == 0 ? std::nullopt : std::optional<double>(*x);
        }
        return x.has_value();
      };
      arg.show = [field](const torch::optim::OptimizerOptions& o) -> std::optional<ArgValue> {
        return ArgValue(field(cast(o)).value_or(0.0));
      };
    }
    entry_.args.push_back(std::move(arg));
    return *this;
  }

  /// Binds a boolean (bool) or an optional boolean (std::optional<bool>, left out of optimizer_args when unset).
  template <class Field>
  OptimizerBinding& bind(std::string key, Field field, std::string doc) {
    using T = std::decay_t<decltype(field(std::declval<Options&>()))>;
    static_assert(std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>,
                  "bind(key, field, doc) takes a boolean field");
    OptimizerArg arg;
    arg.name = std::move(key);
    arg.doc = std::move(doc);
    arg.type = "boolean";
    arg.expected = "true or false";
    arg.read = [field](const ArgValue& v, torch::optim::OptimizerOptions& o) {
      const auto* b = v.get_if<bool>();
      if (b == nullptr) {
        return false;
      }
      field(cast(o)) = *b;
      return true;
    };
    arg.show = [field](const torch::optim::OptimizerOptions& o) -> std::optional<ArgValue> {
      const auto& value = field(cast(o));
      if constexpr (std::is_same_v<T, bool>) {
        return ArgValue(value);
      } else {
        return value.has_value() ? std::optional<ArgValue>(ArgValue(*value)) : std::nullopt;
      }
    };
    entry_.args.push_back(std::move(arg));
    return *this;
  }

  /// The finished entry, for register_optimizer().
  OptimizerEntry entry() const { return entry_; }

 private:
  /// The number in `v` when it is one and `rule` allows it.
  static std::optional<double> number_in(const ArgValue& v, const NumberRule& rule) {
    const auto x = v.as_number();
    return x && rule.allows(*x) ? x : std::nullopt;
  }
  static Options& cast(torch::optim::OptimizerOptions& o) { return static_cast<Options&>(o); }
  static const Options& cast(const torch::optim::OptimizerOptions& o) { return static_cast<const Options&>(o); }

  OptimizerEntry entry_;
};

}  // namespace trainkit::optim
