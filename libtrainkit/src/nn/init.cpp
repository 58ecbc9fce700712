#include "trainkit/nn/init.h"

#include <cmath>
#include <regex>

#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::nn::init {
namespace {

int64_t correct_fan(const at::Tensor& tensor, FanMode mode) {
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  return mode == FanMode::fan_in ? fan_in : fan_out;
}

double kaiming_std(const at::Tensor& tensor, double a, FanMode mode, const std::string& nonlinearity) {
  const int64_t fan = correct_fan(tensor, mode);
  TRAINKIT_CHECK_ARG(fan > 0, "kaiming init: fan is 0 for a tensor of {} elements", tensor.numel());
  return calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
}

double xavier_std(const at::Tensor& tensor, double gain) {
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  return gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
}

double norm_cdf(double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; }

/// "torch::nn::Conv2dImpl" -> "Conv2d"; "(anonymous namespace)::Block" -> "Block".
std::string short_type(const std::string& name) {
  std::string s = name;
  if (const auto colon = s.rfind("::"); colon != std::string::npos) {
    s = s.substr(colon + 2);
  }
  const std::string impl = "Impl";
  if (s.size() > impl.size() && s.compare(s.size() - impl.size(), impl.size(), impl) == 0) {
    s.resize(s.size() - impl.size());
  }
  return s;
}

}  // namespace

double calculate_gain(const std::string& nonlinearity, std::optional<double> param) {
  static const std::vector<std::string> linear = {"linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                                                  "conv_transpose2d", "conv_transpose3d", "sigmoid"};
  if (std::find(linear.begin(), linear.end(), nonlinearity) != linear.end()) {
    return 1.0;
  }
  if (nonlinearity == "tanh") {
    return 5.0 / 3;
  }
  if (nonlinearity == "relu") {
    return std::sqrt(2.0);
  }
  if (nonlinearity == "leaky_relu") {
    const double slope = param.value_or(0.01);
    return std::sqrt(2.0 / (1 + slope * slope));
  }
  if (nonlinearity == "selu") {
    return 3.0 / 4;
  }
  throw std::invalid_argument("calculate_gain: unsupported nonlinearity \"" + nonlinearity + "\"");
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const at::Tensor& tensor) {
  TRAINKIT_CHECK_ARG(tensor.dim() >= 2,
                     "fan in and fan out need a tensor of 2 or more dimensions, got {}", tensor.dim());
  int64_t receptive = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) {
    receptive *= tensor.size(d);
  }
  return {tensor.size(1) * receptive, tensor.size(0) * receptive};
}

at::Tensor uniform_(at::Tensor tensor, double a, double b, std::optional<at::Generator> gen) {
  torch::NoGradGuard no_grad;
  return tensor.uniform_(a, b, gen);
}

at::Tensor normal_(at::Tensor tensor, double mean, double std, std::optional<at::Generator> gen) {
  torch::NoGradGuard no_grad;
  return tensor.normal_(mean, std, gen);
}

at::Tensor trunc_normal_(at::Tensor tensor, double mean, double std, double a, double b,
                         std::optional<at::Generator> gen) {
  TRAINKIT_CHECK_ARG(std > 0, "trunc_normal_: invalid std: {}", std);
  TRAINKIT_CHECK_ARG(a < b, "trunc_normal_: invalid bounds: a = {}, b = {}", a, b);
  torch::NoGradGuard no_grad;
  const double p = norm_cdf((b - mean) / std) - norm_cdf((a - mean) / std);
  if (p > 0.3) {
    // Most draws land in [a, b]: draw normals and redraw those outside. The bounds are rounded to the
    // tensor's dtype so the test agrees with the values it can hold.
    const double lo = at::scalar_tensor(a, tensor.options().device(at::kCPU)).item<double>();
    const double hi = at::scalar_tensor(b, tensor.options().device(at::kCPU)).item<double>();
    at::Tensor result = tensor.normal_(mean, std, gen);
    while (true) {
      const at::Tensor mask = result.lt(lo).logical_or_(result.gt(hi));
      if (!mask.any().item<bool>()) {
        break;
      }
      result = at::where(mask, at::empty_like(result).normal_(mean, std, gen), result);
    }
    if (!result.is_same(tensor)) {
      tensor.copy_(result);
    }
    return tensor;
  }
  // A narrow window: rejection sampling from U(a, b), accepting with probability pdf(x) / pdf(mode).
  const double mode = std::max(a, std::min(mean, b));
  const double log_peak = -0.5 * std::pow((mode - mean) / std, 2);
  at::Tensor candidates = at::empty_like(tensor);
  at::Tensor accept_buf = at::empty_like(tensor);
  const auto log_pdf = [&](at::Tensor& c) { c.sub_(mean).div_(std).pow_(2).mul_(-0.5).sub_(log_peak); };
  tensor.uniform_(a, b, gen);
  candidates.copy_(tensor);
  log_pdf(candidates);
  at::Tensor pending = accept_buf.uniform_(0.0, 1.0, gen).log_().gt(candidates);
  if (pending.any().item<bool>()) {
    at::Tensor result = tensor;
    while (true) {
      candidates.uniform_(a, b, gen);
      result = at::where(pending, candidates, result);
      log_pdf(candidates);
      pending = at::where(pending, accept_buf.uniform_(0.0, 1.0, gen).log_().gt(candidates), pending);
      if (!pending.any().item<bool>()) {
        break;
      }
    }
    tensor.copy_(result);
  }
  return tensor;
}

at::Tensor constant_(at::Tensor tensor, double value) {
  torch::NoGradGuard no_grad;
  return tensor.fill_(value);
}

at::Tensor zeros_(at::Tensor tensor) {
  torch::NoGradGuard no_grad;
  return tensor.zero_();
}

at::Tensor ones_(at::Tensor tensor) { return constant_(std::move(tensor), 1.0); }

at::Tensor kaiming_normal_(at::Tensor tensor, double a, FanMode mode, const std::string& nonlinearity,
                           std::optional<at::Generator> gen) {
  const double std = kaiming_std(tensor, a, mode, nonlinearity);
  torch::NoGradGuard no_grad;
  return tensor.normal_(0, std, gen);
}

at::Tensor kaiming_uniform_(at::Tensor tensor, double a, FanMode mode, const std::string& nonlinearity,
                            std::optional<at::Generator> gen) {
  const double bound = std::sqrt(3.0) * kaiming_std(tensor, a, mode, nonlinearity);
  torch::NoGradGuard no_grad;
  return tensor.uniform_(-bound, bound, gen);
}

at::Tensor xavier_normal_(at::Tensor tensor, double gain, std::optional<at::Generator> gen) {
  const double std = xavier_std(tensor, gain);
  torch::NoGradGuard no_grad;
  return tensor.normal_(0.0, std, gen);
}

at::Tensor xavier_uniform_(at::Tensor tensor, double gain, std::optional<at::Generator> gen) {
  const double a = std::sqrt(3.0) * xavier_std(tensor, gain);
  torch::NoGradGuard no_grad;
  return tensor.uniform_(-a, a, gen);
}

at::Tensor lecun_normal_(at::Tensor tensor, std::optional<at::Generator> gen) {
  return kaiming_normal_(std::move(tensor), 0.0, FanMode::fan_in, "linear", std::move(gen));
}

at::Tensor orthogonal_(at::Tensor tensor, double gain, std::optional<at::Generator> gen) {
  TRAINKIT_CHECK_ARG(tensor.dim() >= 2, "orthogonal_: needs a tensor of 2 or more dimensions, got {}", tensor.dim());
  if (tensor.numel() == 0) {
    return tensor;
  }
  torch::NoGradGuard no_grad;
  const int64_t rows = tensor.size(0);
  const int64_t cols = tensor.numel() / rows;
  at::Tensor flat = tensor.new_empty({rows, cols}).normal_(0, 1, gen);
  if (rows < cols) {
    flat.t_();
  }
  auto [q, r] = at::linalg_qr(flat);
  q.mul_(at::diag(r, 0).sign());
  if (rows < cols) {
    q.t_();
  }
  tensor.view_as(q).copy_(q);
  return tensor.mul_(gain);
}

std::vector<std::string> apply(torch::nn::Module& module, const std::vector<Rule>& rules) {
  std::vector<std::regex> paths;
  for (const auto& rule : rules) {
    TRAINKIT_CHECK_ARG(static_cast<bool>(rule.init), "init::apply: a rule has no initializer");
    try {
      paths.emplace_back(rule.path.empty() ? ".*" : rule.path);
    } catch (const std::regex_error& e) {
      throw std::invalid_argument("init::apply: invalid path regex \"" + rule.path + "\": " + e.what());
    }
  }
  std::vector<std::string> done;
  torch::NoGradGuard no_grad;
  for (const auto& item : module.named_modules()) {
    const std::string type = short_type(item.value()->name());
    for (const auto& param : item.value()->named_parameters(/*recurse=*/false)) {
      const std::string qualified = item.key().empty() ? param.key() : item.key() + "." + param.key();
      for (size_t i = 0; i < rules.size(); ++i) {
        const Rule& rule = rules[i];
        if ((rule.module_type.empty() || rule.module_type == type) &&
            (rule.parameter.empty() || rule.parameter == param.key()) && std::regex_match(qualified, paths[i])) {
          rule.init(param.value());
          done.push_back(qualified);
          break;
        }
      }
    }
  }
  return done;
}

Rule zero_init_residual(const std::string& path) {
  return Rule{"", "", path, [](at::Tensor t) { zeros_(std::move(t)); }};
}

const std::vector<std::string>& scheme_names() {
  static const std::vector<std::string> names = {"default",        "kaiming_normal", "kaiming_uniform",
                                                 "xavier_normal",  "xavier_uniform", "lecun_normal"};
  return names;
}

std::vector<Rule> scheme(const std::string& name) {
  Initializer weight;
  if (name == "default") {
    return {};
  } else if (name == "kaiming_normal") {
    weight = [](at::Tensor t) { kaiming_normal_(std::move(t), 0.0, FanMode::fan_in, "relu"); };
  } else if (name == "kaiming_uniform") {
    weight = [](at::Tensor t) { kaiming_uniform_(std::move(t), 0.0, FanMode::fan_in, "relu"); };
  } else if (name == "xavier_normal") {
    weight = [](at::Tensor t) { xavier_normal_(std::move(t)); };
  } else if (name == "xavier_uniform") {
    weight = [](at::Tensor t) { xavier_uniform_(std::move(t)); };
  } else if (name == "lecun_normal") {
    weight = [](at::Tensor t) { lecun_normal_(std::move(t)); };
  } else {
    throw std::invalid_argument("init::scheme: unknown scheme \"" + name + "\"");
  }
  const Initializer zero = [](at::Tensor t) { zeros_(std::move(t)); };
  const Initializer one = [](at::Tensor t) { ones_(std::move(t)); };
  std::vector<Rule> rules;
  for (const std::string type : {"Linear", "Conv1d", "Conv2d", "Conv3d"}) {
    rules.push_back({type, "weight", "", weight});
    rules.push_back({type, "bias", "", zero});
  }
  for (const std::string type : {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d"}) {
    rules.push_back({type, "weight", "", one});
    rules.push_back({type, "bias", "", zero});
  }
  return rules;
}

}  // namespace trainkit::nn::init
