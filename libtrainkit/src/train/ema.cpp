#include "trainkit/train/ema.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::train {

std::vector<at::Tensor> weight_tensors(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& p : module.parameters()) {
    out.push_back(p.detach());
  }
  for (const auto& b : module.buffers()) {
    out.push_back(b.detach());
  }
  return out;
}

ScopedWeights::ScopedWeights(torch::nn::Module& module, const std::vector<at::Tensor>& values)
    : targets_(weight_tensors(module)) {
  TRAINKIT_CHECK_ARG(targets_.size() == values.size(), "ScopedWeights: {} tensors for a module with {}", values.size(),
                     targets_.size());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < targets_.size(); ++i) {
    saved_.push_back(targets_[i].clone());
    targets_[i].copy_(values[i]);
  }
}

ScopedWeights::~ScopedWeights() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < targets_.size(); ++i) {
    targets_[i].copy_(saved_[i]);
  }
}

void save_tensors(torch::serialize::OutputArchive& archive, const std::vector<at::Tensor>& values) {
  archive.write("count", torch::tensor(static_cast<int64_t>(values.size())));
  for (size_t i = 0; i < values.size(); ++i) {
    archive.write(fmt::format("tensor/{}", i), values[i]);
  }
}

void load_tensors(torch::serialize::InputArchive& archive, std::vector<at::Tensor>& values, const std::string& who) {
  at::Tensor count;
  archive.read("count", count);
  TRAINKIT_CHECK_ARG(count.item<int64_t>() == static_cast<int64_t>(values.size()),
                     "{}: the checkpoint holds {} averaged tensors, the model has {}", who, count.item<int64_t>(),
                     values.size());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < values.size(); ++i) {
    at::Tensor t;
    archive.read(fmt::format("tensor/{}", i), t);
    TRAINKIT_CHECK_ARG(t.sizes() == values[i].sizes(), "{}: averaged tensor {} has shape {} in the checkpoint, {} in "
                       "the model", who, i, c10::str(t.sizes()), c10::str(values[i].sizes()));
    values[i].copy_(t);
  }
}

ModelEma::ModelEma(const torch::nn::Module& model, ModelEmaOptions options) : options_(options) {
  check_options(ModelEmaOptions::binding(), options_, "ModelEma");
  num_params_ = model.parameters().size();
  for (const auto& t : weight_tensors(model)) {
    values_.push_back(t.clone());
  }
}

double ModelEma::get_decay(std::optional<int64_t> step) const {
  if (!step) {
    return options_.decay();
  }
  const int64_t t = std::max<int64_t>(0, *step - options_.update_after_step() - 1);
  if (t <= 0) {
    return 0.0;
  }
  if (!options_.use_warmup()) {
    return options_.decay();
  }
  const double d =
      1.0 - std::pow(1.0 + static_cast<double>(t) / options_.warmup_gamma(), -options_.warmup_power());
  return std::max(std::min(d, options_.decay()), options_.min_decay());
}

void ModelEma::update(const torch::nn::Module& model, std::optional<int64_t> step) {
  const double weight = 1.0 - get_decay(step);
  const std::vector<at::Tensor> current = weight_tensors(model);
  TRAINKIT_CHECK_ARG(current.size() == values_.size(), "ModelEma::update: the model has {} tensors, the average {}",
                     current.size(), values_.size());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < values_.size(); ++i) {
    const bool buffer = i >= num_params_;
    if (values_[i].is_floating_point() && !(buffer && options_.exclude_buffers())) {
      values_[i].lerp_(current[i].to(values_[i].device(), values_[i].scalar_type()), weight);
    } else {
      values_[i].copy_(current[i]);
    }
  }
}

void ModelEma::set(const torch::nn::Module& model) {
  const std::vector<at::Tensor> current = weight_tensors(model);
  TRAINKIT_CHECK_ARG(current.size() == values_.size(), "ModelEma::set: the model has {} tensors, the average {}",
                     current.size(), values_.size());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < values_.size(); ++i) {
    values_[i].copy_(current[i]);
  }
}

void ModelEma::save(torch::serialize::OutputArchive& archive) const { save_tensors(archive, values_); }

void ModelEma::load(torch::serialize::InputArchive& archive) { load_tensors(archive, values_, "ModelEma::load"); }

}  // namespace trainkit::train
