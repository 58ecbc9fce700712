#include "trainkit/train/metric.h"

#include <stdexcept>

#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::train {
namespace {

at::Tensor pair(const at::Tensor& sum, int64_t count) {
  return torch::stack({sum.to(torch::kFloat64), torch::full({}, static_cast<double>(count),
                                                             sum.options().dtype(torch::kFloat64))});
}

const at::Tensor& first_target(const data::Batch& batch, const char* metric) {
  TRAINKIT_CHECK_ARG(!batch.targets().empty() && batch.target().defined(), "{}: the batch has no target", metric);
  return batch.target();
}

void check_same_numel(const at::Tensor& output, const at::Tensor& target, const char* metric) {
  TRAINKIT_CHECK_ARG(output.numel() == target.numel(), "{}: output {} and target {} differ in size", metric,
                     c10::str(output.sizes()), c10::str(target.sizes()));
}

void check_classes(const at::Tensor& output, const at::Tensor& target, const char* metric) {
  TRAINKIT_CHECK_ARG(output.dim() >= 2 && output.size(0) == target.size(0),
                     "{}: needs an output [B, C, ...] of class scores and a target [B, ...] of class indices, got "
                     "output {} and target {}",
                     metric, c10::str(output.sizes()), c10::str(target.sizes()));
}

}  // namespace

MeanMetric::MeanMetric(std::string name, SumFn fn) : name_(std::move(name)), fn_(std::move(fn)) {
  TRAINKIT_CHECK_ARG(!name_.empty(), "MeanMetric: the name must not be empty");
  TRAINKIT_CHECK_ARG(static_cast<bool>(fn_), "MeanMetric {}: the function must not be empty", name_);
}

void MeanMetric::update(const at::Tensor& output, const data::Batch& batch) {
  const at::Tensor sums = fn_(output.detach(), batch).to(torch::kFloat64).reshape({-1});
  TRAINKIT_CHECK_ARG(sums.numel() == 2, "metric {}: the function must return [sum, count], got {} values", name_,
                     sums.numel());
  if (sums_.defined() && sums_.device() == sums.device()) {
    sums_ += sums;
  } else {
    sums_ = sums_.defined() ? sums_.to(sums.device()) + sums : sums.clone();
  }
}

double MeanMetric::compute() const {
  if (!sums_.defined()) {
    return 0.0;
  }
  const at::Tensor s = sums_.cpu();
  const double count = s[1].item<double>();
  return count > 0 ? s[0].item<double>() / count : 0.0;
}

void MeanMetric::reset() { sums_ = at::Tensor(); }

at::Tensor MeanMetric::state() const {
  return sums_.defined() ? sums_ : torch::zeros({2}, torch::kFloat64);
}

void MeanMetric::set_state(const at::Tensor& state) {
  TRAINKIT_CHECK_ARG(state.numel() == 2, "metric {}: a state of 2 values expected, got {}", name_, state.numel());
  sums_ = state.to(torch::kFloat64).reshape({2}).clone();
}

std::shared_ptr<Metric> accuracy() {
  return std::make_shared<MeanMetric>("accuracy", [](const at::Tensor& out, const data::Batch& b) {
    const at::Tensor& target = first_target(b, "accuracy");
    check_classes(out, target, "accuracy");
    return pair(out.argmax(1).eq(target).sum(), target.numel());
  });
}

std::shared_ptr<Metric> top_k_accuracy(int64_t k) {
  TRAINKIT_CHECK_ARG(k >= 1, "top_k_accuracy: invalid k: {}", k);
  const std::string name = "top" + std::to_string(k) + "_accuracy";
  return std::make_shared<MeanMetric>(name, [k, name](const at::Tensor& out, const data::Batch& b) {
    const at::Tensor& target = first_target(b, name.c_str());
    check_classes(out, target, name.c_str());
    TRAINKIT_CHECK_ARG(k <= out.size(1), "{}: k = {} but the output has {} classes", name, k, out.size(1));
    const at::Tensor top = std::get<1>(out.topk(k, 1));  // [B, k, ...]
    const at::Tensor hit = top.eq(target.unsqueeze(1)).any(1);
    return pair(hit.sum(), target.numel());
  });
}

namespace {

/// The mean over every element of `error(output - target)`, named `name`.
std::shared_ptr<Metric> elementwise_error(std::string name, at::Tensor (*error)(const at::Tensor&)) {
  return std::make_shared<MeanMetric>(name, [name, error](const at::Tensor& out, const data::Batch& b) {
    const at::Tensor& target = first_target(b, name.c_str());
    check_same_numel(out, target, name.c_str());
    return pair(error(out.to(torch::kFloat64).reshape(-1) - target.to(torch::kFloat64).reshape(-1)).sum(),
                target.numel());
  });
}

}  // namespace

std::shared_ptr<Metric> mean_absolute_error() {
  return elementwise_error("mae", [](const at::Tensor& d) { return d.abs(); });
}

std::shared_ptr<Metric> mean_squared_error() {
  return elementwise_error("mse", [](const at::Tensor& d) { return d.square(); });
}

std::shared_ptr<Metric> make_metric(const std::string& name) {
  if (name == "accuracy") {
    return accuracy();
  }
  if (name == "mae") {
    return mean_absolute_error();
  }
  if (name == "mse") {
    return mean_squared_error();
  }
  const std::string prefix = "top";
  const std::string suffix = "_accuracy";
  if (name.size() > prefix.size() + suffix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.find_first_not_of("0123456789") == std::string::npos && digits.size() < 6) {
      return top_k_accuracy(std::stoll(digits));
    }
  }
  throw std::invalid_argument("unknown metric \"" + name + "\" (known: accuracy, top<k>_accuracy, mae, mse)");
}

ValueRule<std::vector<std::string>> metric_names_rule() {
  return rule::distinct_where("array of strings",
                              "an array of distinct metric names (\"accuracy\", \"top<k>_accuracy\", \"mae\", \"mse\")",
                              [](const std::string& name) {
                                (void)make_metric(name);  // throws, naming the unknown metric
                                return true;
                              });
}

void MetricValues::set(const std::string& name, double value) {
  for (auto& item : items_) {
    if (item.first == name) {
      item.second = value;
      return;
    }
  }
  items_.emplace_back(name, value);
}

std::optional<double> MetricValues::find(const std::string& name) const {
  for (const auto& item : items_) {
    if (item.first == name) {
      return item.second;
    }
  }
  return std::nullopt;
}

double MetricValues::at(const std::string& name) const {
  if (const auto v = find(name)) {
    return *v;
  }
  std::string known;
  for (const auto& item : items_) {
    known += (known.empty() ? "" : ", ") + item.first;
  }
  throw std::out_of_range("no metric \"" + name + "\" (have: " + (known.empty() ? "none" : known) + ")");
}

}  // namespace trainkit::train
