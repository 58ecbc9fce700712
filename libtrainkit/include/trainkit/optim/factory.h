#pragma once
/// @file
/// The optimizer registry and factory: an optimizer chosen by name with named arguments (PyTorch's and
/// timm's names and defaults: `lr`, `betas`, `momentum`, `trust_coefficient` ...), read from any ArgTable.
/// Each optimizer registers once, binding argument names to its Options fields (see OptimizerBinding, an
/// OptionBinding of trainkit/options.h);
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
#include "trainkit/options.h"
#include "trainkit/optim/optimizer_options.h"
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
  /// Layer-wise LR decay (timm's layer_decay): 0 = off; else each layer's group gets lr × layer_decay^(deepest
  /// − layer) and the parameters with ndim <= 1 weight decay 0 (make_optimizer over layer_decay_groups).
  double layer_decay = 0.0;
  /// Learning rates by parameter name (lr_groups; not together with layer_decay): empty = off.
  std::vector<LrRule> lr_by_name;
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

/// The optimizer of `spec` over layer-decay groups (layer_decay_groups): each group spec.options with
/// lr × lr_scale and the group's weight decay.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<LayerDecayGroup>& groups);

/// The effective value of every argument of spec's optimizer (unset optional ones left out), in
/// binding order, then `no_decay_1d`, `layer_decay` and (when set) `lr_by_name`: what a run's config.toml
/// records.
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
/// Every argument name once (in binding order, optimizers taken by name), then `no_decay_1d`,
/// `layer_decay` and `lr_by_name`.
std::vector<OptimizerArgDoc> optimizer_arg_docs();

/// One bound argument of one optimizer, type-erased over the Options types (OptimizerBinding writes these).
using OptimizerArg = OptionField<torch::optim::OptimizerOptions>;

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
  /// Layer-decay groups as param groups of the optimizer's options type (to_param_groups with `options`).
  std::function<std::vector<torch::optim::OptimizerParamGroup>(const std::vector<LayerDecayGroup>& groups,
                                                               const torch::optim::OptimizerOptions& options)>
      layer_groups;
};

/// Adds an optimizer to the factory. Throws std::invalid_argument when the name is taken.
void register_optimizer(OptimizerEntry entry);
/// Removes optimizer `name` from the factory (one that a plugin or a test added); returns whether it was there.
bool unregister_optimizer(const std::string& name);

// The number rules, where optimizer bindings have always found them.
using trainkit::NumberRule;
using trainkit::non_negative;
using trainkit::positive;
using trainkit::unit_interval;

/// Writes the OptimizerEntry of optimizer class `Opt` (which has `Opt::options_type`, a constructor from
/// (param groups, options) and a static `validate(const Options&)`, as every OptimizerBase subclass does).
/// Its arguments are the fields of `Options::binding()` (an OptimizerOptionsBinding, trainkit/optim/
/// optimizer_options.h) when the Options type has one; bind() adds fields like any OptionBinding
/// (trainkit/options.h), for Options without one; a std::optional<double> field is bound with a number rule
/// where 0 means unset:
///
///     register_optimizer(OptimizerBinding<Lion>("lion").entry());   // LionOptions::binding()'s keys
template <class Opt>
class OptimizerBinding {
 public:
  /// The optimizer's options type.
  using Options = typename Opt::options_type;

  /// An entry named `name` with the arguments of `Options::binding()`, or none when it has no binding.
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
    entry_.layer_groups = [](const std::vector<LayerDecayGroup>& groups, const torch::optim::OptimizerOptions& o) {
      return to_param_groups(groups, cast(o));
    };
    if constexpr (has_binding<Options>(0)) {
      options_ = Options::binding();
    }
  }

  /// Binds a number, a pair of numbers or an optional number (see OptimizerOptionsBinding::bind).
  template <class Field>
  OptimizerBinding& bind(std::string key, Field field, NumberRule range, std::string doc) {
    options_.bind(std::move(key), field, range, std::move(doc));
    return *this;
  }

  /// Binds a boolean (bool) or an optional boolean (std::optional<bool>, left out of optimizer_args when unset).
  template <class Field>
  OptimizerBinding& bind(std::string key, Field field, std::string doc) {
    options_.bind(std::move(key), field, std::move(doc));
    return *this;
  }

  /// The finished entry, for register_optimizer().
  OptimizerEntry entry() const {
    OptimizerEntry out = entry_;
    OptionBinding<torch::optim::OptimizerOptions> upcast;
    upcast.include(options_.fields(), [](auto& o) -> auto& { return cast(o); });
    out.args = upcast.fields();
    return out;
  }

 private:
  template <class O>
  static constexpr auto has_binding(int) -> decltype(O::binding().fields(), bool()) {
    return true;
  }
  template <class O>
  static constexpr bool has_binding(...) {
    return false;
  }
  static Options& cast(torch::optim::OptimizerOptions& o) { return static_cast<Options&>(o); }
  static const Options& cast(const torch::optim::OptimizerOptions& o) { return static_cast<const Options&>(o); }

  OptimizerEntry entry_;
  OptimizerOptionsBinding<Options> options_;
};

}  // namespace trainkit::optim
