#pragma once
/// @file
/// Param-group helpers: the usual split that keeps biases and norm weights out of weight decay (and so out
/// of LARS/LAMB adaptation), as timm's param_groups_weight_decay does; and layer-wise LR decay, as timm's
/// param_groups_layer_decay (BEiT's): parameters grouped by depth, each group's LR scaled by
/// layer_decay^(deepest - depth); and learning rates by parameter name, as a PyTorch param group with its
/// own 'lr' (lr_groups).
///
///   auto ids = optim::layer_ids(names, {{{"^stem"}}, {{"^blocks\\.(\\d+)"}}});  // depth by block number
///   auto groups = optim::layer_decay_groups(model->named_parameters(), ids, optim::LayerDecayOptions());
///   optim::AdamW opt(optim::to_param_groups(groups, optim::AdamWOptions(1e-3)), optim::AdamWOptions(1e-3));
///
///   auto by_name = optim::lr_groups(model->named_parameters(), {{"conv1", {"0.*", "1.*"}, 0.01}, {"fc", {"8.*"}, 1e-4}});
///   optim::Sgd sgd(optim::to_param_groups(by_name, optim::SgdOptions(1e-3)), optim::SgdOptions(1e-3));

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/ordered_dict.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace trainkit::optim {

/// Whether an options type has a weight_decay setter (Rprop's has none).
template <class Options, class = void>
struct has_weight_decay : std::false_type {};
template <class Options>
struct has_weight_decay<Options, std::void_t<decltype(std::declval<Options&>().weight_decay(0.0))>> : std::true_type {};

/// Two groups: first the parameters with ndim ≤ 1 (biases, norm weights) with weight_decay 0, then the
/// others with `options` as given. Works with any options type that has a weight_decay setter (trainkit's
/// and LibTorch's); one without (Rprop's) keeps its options in both. Empty groups are left out.
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> weight_decay_param_groups(const std::vector<at::Tensor>& params,
                                                                         const Options& options) {
  std::vector<at::Tensor> no_decay;
  std::vector<at::Tensor> decay;
  for (const auto& p : params) {
    (p.dim() <= 1 ? no_decay : decay).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!no_decay.empty()) {
    Options zero = options;
    if constexpr (has_weight_decay<Options>::value) {
      zero.weight_decay(0.0);
    }
    groups.emplace_back(no_decay, std::make_unique<Options>(zero));
  }
  if (!decay.empty()) {
    groups.emplace_back(decay, std::make_unique<Options>(options));
  }
  return groups;
}

/// One rule of a layer matcher, timm's group_matcher entries: a parameter whose name matches `pattern` from
/// its start (ECMAScript regex; every alternative anchored at the start, as Python's re.match) gets the sort
/// key (group ordinal, the numbers its capture groups matched..., `suffix`...).
struct LayerRule {
  std::string pattern;
  std::vector<double> suffix = {};
};

/// A suffix that puts a match into the layer before it (timm's MATCH_PREV_GROUP, e.g. a final norm into the
/// last block).
constexpr double kMatchPreviousLayer = 99999;

/// Layer ids of `names` (timm's group_with_matcher with reverse=True): `groups[i]` holds the rules of group
/// ordinal i, tried in order; the first match gives a name's key, an unmatched name (a head) sorts last.
/// Names are ordered by key (lexicographically) and each distinct key starts a new layer, except a key
/// ending in kMatchPreviousLayer, which joins the layer before it. Throws std::invalid_argument for a
/// pattern that does not compile (naming it) or a capture that is not a number.
std::map<std::string, int64_t> layer_ids(const std::vector<std::string>& names,
                                         const std::vector<std::vector<LayerRule>>& groups);

/// Layer ids of `model`'s parameters by its direct children, for a model that is a sequence of layers (a
/// torch::nn::Sequential of convolutions, blocks, norms, a head): a layer begins at each child that holds a
/// parameter with ndim >= 2 (a convolution, a linear layer, a residual block), and a child whose parameters
/// are all 1-D (a norm after a convolution) joins the layer before it, as a stem's norm joins the stem in
/// timm's matchers. Ids count from 0 at the input; the model's own (not a child's) parameters are layer 0.
std::map<std::string, int64_t> child_layer_ids(const torch::nn::Module& model);

/// Options of layer_decay_groups(); names and defaults are timm's param_groups_layer_decay.
struct LayerDecayOptions {
  /// Weight decay of the decayed groups.
  TORCH_ARG(double, weight_decay) = 0.05;
  /// Per-layer LR factor: layer l of L gets layer_decay^(L - 1 - l).
  TORCH_ARG(double, layer_decay) = 0.75;
  /// Floor of the LR scale.
  TORCH_ARG(double, min_scale) = 0.0;
  /// No weight decay for tensors with ndim <= 1 (biases, norm weights).
  TORCH_ARG(bool, exclude_1d) = true;
  /// Further names without weight decay: shell-style patterns (`*` any run, `?` one character), as fnmatch.
  TORCH_ARG(std::vector<std::string>, no_weight_decay) = {};
};

/// One group of layer_decay_groups().
struct LayerDecayGroup {
  std::string name;          ///< "layer_<id>_decay" or "layer_<id>_no_decay", as timm names it
  double lr_scale = 1.0;     ///< multiplies the optimizer's LR (when `lr` is unset)
  std::optional<double> lr;  ///< the group's own LR, replacing the optimizer's (lr_groups)
  double weight_decay = 0.0;
  std::vector<std::string> param_names;
  std::vector<at::Tensor> params;
};

/// timm's param_groups_layer_decay: the parameters that require grad, in order, into one group per (layer,
/// decay or not), in order of first appearance. A name missing from `layer_of` is in the deepest layer.
std::vector<LayerDecayGroup> layer_decay_groups(const torch::OrderedDict<std::string, at::Tensor>& named_params,
                                                const std::map<std::string, int64_t>& layer_of,
                                                const LayerDecayOptions& options = {});

/// Whether `name` matches the shell-style `pattern` (`*`, `?`; Python's fnmatch without character classes).
bool matches_wildcard(const std::string& name, const std::string& pattern);

/// One rule of lr_groups(): the parameters whose name matches one of `patterns` (shell-style, as
/// matches_wildcard) train with learning rate `lr`, in a group called `name`.
struct LrRule {
  std::string name;
  std::vector<std::string> patterns;
  double lr = 0.0;
};

/// Options of lr_groups().
struct LrGroupsOptions {
  /// Weight decay of every group (of the decayed halves with exclude_1d).
  TORCH_ARG(double, weight_decay) = 0.0;
  /// Each group's parameters with ndim <= 1 (biases, norm weights) in a second group "<name>_no_decay"
  /// with weight decay 0.
  TORCH_ARG(bool, exclude_1d) = false;
};

/// Learning rates by parameter name (PyTorch's `[{'params': ..., 'lr': 0.01}, ...]`): one group per rule, in
/// rule order, holding the parameters that require grad whose name a rule matches first (in the model's
/// order); the parameters no rule matches form a last group "default" with the optimizer's LR (`lr` unset).
/// Throws std::invalid_argument naming the rule when a rule has no pattern, an LR that is not > 0, or matches
/// no parameter (the message lists some of the names), and for a name used twice.
std::vector<LayerDecayGroup> lr_groups(const torch::OrderedDict<std::string, at::Tensor>& named_params,
                                       const std::vector<LrRule>& rules, const LrGroupsOptions& options = {});

/// `groups` as optimizer param groups: each one `options` with the group's `lr` where set, else lr ×
/// lr_scale, and its weight decay. Works with any options type that has get_lr/set_lr (trainkit's and
/// LibTorch's), through set_lr, so a relative-step Adafactor stays one (as timm's); its weight decay where it
/// has one (Rprop has none).
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> to_param_groups(const std::vector<LayerDecayGroup>& groups,
                                                               const Options& options) {
  std::vector<torch::optim::OptimizerParamGroup> out;
  for (const auto& g : groups) {
    Options o = options;
    o.set_lr(g.lr ? *g.lr : options.get_lr() * g.lr_scale);
    if constexpr (has_weight_decay<Options>::value) {
      o.weight_decay(g.weight_decay);
    }
    out.emplace_back(g.params, std::make_unique<Options>(o));
  }
  return out;
}

}  // namespace trainkit::optim
