#pragma once
/// @file
/// Weight initialization: torch.nn.init's initializers (same arguments, defaults and random draws: for the
/// same generator state they fill the same values), and rules that apply them over a module tree by module
/// type and parameter name, with a few named schemes for `model.init` in the config.
///
///   torch::manual_seed(0);
///   auto net = trainkit::nn::make_cnn();
///   trainkit::nn::init::apply(*net, trainkit::nn::init::scheme("kaiming_normal"));

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace trainkit::nn::init {

/// Which fan Kaiming initialization preserves: the forward pass's variance (fan_in) or backward's (fan_out).
enum class FanMode { fan_in, fan_out };

/// torch.nn.init.calculate_gain: 1 for linear/conv*/sigmoid, 5/3 for tanh, √2 for relu,
/// √(2 / (1 + slope²)) for leaky_relu (slope = `param`, default 0.01), 3/4 for selu.
/// Throws std::invalid_argument for another name.
double calculate_gain(const std::string& nonlinearity, std::optional<double> param = std::nullopt);

/// (fan_in, fan_out) = (size(1)·r, size(0)·r), r = the product of the sizes after the second (the
/// receptive field of a convolution). Needs at least 2 dimensions.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const at::Tensor& tensor);

/// Fills with U(a, b).
at::Tensor uniform_(at::Tensor tensor, double a = 0.0, double b = 1.0, std::optional<at::Generator> gen = {});
/// Fills with N(mean, std²).
at::Tensor normal_(at::Tensor tensor, double mean = 0.0, double std = 1.0, std::optional<at::Generator> gen = {});
/// Fills with N(mean, std²) truncated to [a, b], by torch.nn.init.trunc_normal_'s algorithm (resampling
/// out-of-range draws when P(a ≤ X ≤ b) > 0.3, else rejection sampling from U(a, b)).
at::Tensor trunc_normal_(at::Tensor tensor, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0,
                         std::optional<at::Generator> gen = {});
/// Fills with `value`.
at::Tensor constant_(at::Tensor tensor, double value);
/// Fills with 0.
at::Tensor zeros_(at::Tensor tensor);
/// Fills with 1.
at::Tensor ones_(at::Tensor tensor);

/// He et al. 2015 (arXiv 1502.01852): N(0, std²), std = gain / √fan, gain = calculate_gain(nonlinearity, a).
/// PyTorch's defaults: a = 0, fan_in, "leaky_relu" (so gain √2).
at::Tensor kaiming_normal_(at::Tensor tensor, double a = 0.0, FanMode mode = FanMode::fan_in,
                           const std::string& nonlinearity = "leaky_relu", std::optional<at::Generator> gen = {});
/// He et al. 2015: U(-bound, bound), bound = gain · √(3 / fan).
at::Tensor kaiming_uniform_(at::Tensor tensor, double a = 0.0, FanMode mode = FanMode::fan_in,
                            const std::string& nonlinearity = "leaky_relu", std::optional<at::Generator> gen = {});
/// Glorot & Bengio 2010: N(0, std²), std = gain · √(2 / (fan_in + fan_out)).
at::Tensor xavier_normal_(at::Tensor tensor, double gain = 1.0, std::optional<at::Generator> gen = {});
/// Glorot & Bengio 2010: U(-a, a), a = gain · √(6 / (fan_in + fan_out)).
at::Tensor xavier_uniform_(at::Tensor tensor, double gain = 1.0, std::optional<at::Generator> gen = {});
/// LeCun et al. 1998: N(0, 1 / fan_in), i.e. kaiming_normal_ with the "linear" gain. (This is what the
/// notes call he_init; He's initialization has twice the variance for ReLU.)
at::Tensor lecun_normal_(at::Tensor tensor, std::optional<at::Generator> gen = {});
/// Saxe et al. 2013 (arXiv 1312.6120): a (semi-)orthogonal matrix (the tensor viewed as size(0) × rest)
/// from the QR decomposition of a standard normal draw, signs fixed by diag(R), times `gain`.
at::Tensor orthogonal_(at::Tensor tensor, double gain = 1.0, std::optional<at::Generator> gen = {});

/// Fills one parameter in place (called with grad disabled).
using Initializer = std::function<void(at::Tensor)>;

/// Which parameters an initializer applies to. Empty fields match anything.
struct Rule {
  /// The owning module's type, short: "Linear", "Conv2d", "BatchNorm2d" (LibTorch's type name without
  /// namespace and "Impl"), or a user module's class name.
  std::string module_type;
  /// The parameter's own name in its module: "weight", "bias".
  std::string parameter;
  /// A regular expression (ECMAScript) that the parameter's qualified name ("3.weight",
  /// "blocks.2.bn2.weight") must match entirely.
  std::string path;
  /// What to do with a matching parameter.
  Initializer init;
};

/// Applies `rules` to the parameters of `module` and its descendants: each parameter gets the first rule
/// that matches it (write specific rules first), or keeps its value. Returns the qualified names of the
/// parameters initialized, in module order.
std::vector<std::string> apply(torch::nn::Module& module, const std::vector<Rule>& rules);

/// A rule that zero-fills the parameters whose qualified name matches `path`: zero-init of residual
/// branches (Goyal et al. 2017, arXiv 1706.02677), e.g. `zero_init_residual("blocks\\.\\d+\\.bn2\\.weight")`
/// makes each branch's last BatchNorm output 0, so every residual block starts as the identity.
Rule zero_init_residual(const std::string& path);

/// The rules of a named scheme, for Linear and Conv1d/2d/3d weights (biases zero; BatchNorm weight 1,
/// bias 0): "default" (no rules: LibTorch's own init, Kaiming-uniform with a = √5), "kaiming_normal",
/// "kaiming_uniform" (fan_in, ReLU gain √2), "xavier_normal", "xavier_uniform" (gain 1), "lecun_normal"
/// (std 1/√fan_in). Throws std::invalid_argument for another name.
std::vector<Rule> scheme(const std::string& name);

/// The names scheme() accepts.
const std::vector<std::string>& scheme_names();

}  // namespace trainkit::nn::init
