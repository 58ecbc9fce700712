#include "trainkit/train/swa.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/train/ema.h"
#include "detail/check.h"

namespace trainkit::train {

AvgFn swa_avg_fn() {
  return [](const at::Tensor& averaged, const at::Tensor& current, int64_t num_averaged) {
    return averaged + (current - averaged) / (num_averaged + 1);
  };
}

AvgFn ema_avg_fn(double decay) {
  TRAINKIT_CHECK_ARG(decay >= 0 && decay <= 1, "ema_avg_fn: invalid decay: {}", decay);
  return [decay](const at::Tensor& averaged, const at::Tensor& current, int64_t) {
    return decay * averaged + (1 - decay) * current;
  };
}

AveragedModel::AveragedModel(const torch::nn::Module& model, AvgFn avg_fn, bool use_buffers)
    : avg_fn_(avg_fn ? std::move(avg_fn) : swa_avg_fn()), use_buffers_(use_buffers) {
  num_params_ = model.parameters().size();
  for (const auto& t : weight_tensors(model)) {
    values_.push_back(t.clone());
  }
}

void AveragedModel::update_parameters(const torch::nn::Module& model) {
  const std::vector<at::Tensor> current = weight_tensors(model);
  TRAINKIT_CHECK_ARG(current.size() == values_.size(),
                     "AveragedModel::update_parameters: the model has {} tensors, the average {}", current.size(),
                     values_.size());
  torch::NoGradGuard no_grad;
  const size_t averaged = use_buffers_ ? values_.size() : num_params_;
  for (size_t i = 0; i < averaged; ++i) {
    const at::Tensor cur = current[i].to(values_[i].device());
    if (n_averaged_ == 0) {
      values_[i].copy_(cur);
    } else {
      values_[i].copy_(avg_fn_(values_[i], cur, n_averaged_));
    }
  }
  for (size_t i = averaged; i < values_.size(); ++i) {
    values_[i].copy_(current[i]);
  }
  ++n_averaged_;
}

void AveragedModel::save(torch::serialize::OutputArchive& archive) const {
  archive.write("n_averaged", torch::tensor(n_averaged_));
  save_tensors(archive, values_);
}

void AveragedModel::load(torch::serialize::InputArchive& archive) {
  at::Tensor n;
  archive.read("n_averaged", n);
  n_averaged_ = n.item<int64_t>();
  load_tensors(archive, values_, "AveragedModel::load");
}

SWALR::SWALR(torch::optim::Optimizer& optimizer, SWALROptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  const size_t groups = num_groups();
  sched::check_arg(options_.swa_lr().size() == 1 || options_.swa_lr().size() == groups, name(), "swa_lr count",
                   static_cast<double>(options_.swa_lr().size()), fmt::format("1 or one per param group ({})", groups));
  for (double lr : options_.swa_lr()) {
    sched::check_arg(lr >= 0, name(), "swa_lr", lr, ">= 0");
  }
  sched::check_arg(options_.anneal_epochs() >= 0, name(), "anneal_epochs",
                   static_cast<double>(options_.anneal_epochs()), ">= 0");
  TRAINKIT_CHECK_ARG(options_.anneal_strategy() == "cos" || options_.anneal_strategy() == "linear",
                     "SWALR: anneal_strategy must be \"cos\" or \"linear\", got \"{}\"", options_.anneal_strategy());
  swa_lrs_ = options_.swa_lr().size() == 1 ? std::vector<double>(groups, options_.swa_lr()[0]) : options_.swa_lr();
  initial_step();
}

double SWALR::anneal(double t) const {
  return options_.anneal_strategy() == "cos" ? (1 - std::cos(M_PI * t)) / 2 : t;
}

std::vector<double> SWALR::get_lr() {
  int64_t step = step_count_ - 1;
  if (options_.anneal_epochs() == 0) {
    step = std::max<int64_t>(1, step);
  }
  const double span = static_cast<double>(std::max<int64_t>(1, options_.anneal_epochs()));
  const double prev_alpha = anneal(std::max(0.0, std::min(1.0, static_cast<double>(step - 1) / span)));
  const double alpha = anneal(std::max(0.0, std::min(1.0, static_cast<double>(step) / span)));
  const std::vector<double> lrs = group_lrs();
  std::vector<double> out;
  for (size_t i = 0; i < lrs.size(); ++i) {
    // The LR annealing began from, recovered from the current one (PyTorch's _get_initial_lr).
    const double lr0 = prev_alpha == 1 ? swa_lrs_[i] : (lrs[i] - prev_alpha * swa_lrs_[i]) / (1 - prev_alpha);
    out.push_back(swa_lrs_[i] * alpha + lr0 * (1 - alpha));
  }
  return out;
}

namespace {

/// The momentum option of a BatchNorm of any dimension, or null.
std::optional<double>* bn_momentum(torch::nn::Module& m) {
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm1dImpl*>(&m)) {
    return &bn->options.momentum();
  }
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(&m)) {
    return &bn->options.momentum();
  }
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm3dImpl*>(&m)) {
    return &bn->options.momentum();
  }
  return nullptr;
}

void reset_bn(torch::nn::Module& m) {
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm1dImpl*>(&m)) {
    bn->reset_running_stats();
  } else if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(&m)) {
    bn->reset_running_stats();
  } else if (auto* bn = dynamic_cast<torch::nn::BatchNorm3dImpl*>(&m)) {
    bn->reset_running_stats();
  }
}

}  // namespace

void update_bn(torch::nn::Module& module, const ForwardFn& forward, data::BatchSource& source) {
  std::vector<std::pair<std::optional<double>*, std::optional<double>>> momenta;
  for (const auto& m : module.modules(/*include_self=*/true)) {
    if (auto* momentum = bn_momentum(*m)) {
      reset_bn(*m);
      momenta.emplace_back(momentum, *momentum);
    }
  }
  if (momenta.empty()) {
    return;
  }
  const bool was_training = module.is_training();
  module.train();
  for (auto& [momentum, saved] : momenta) {
    *momentum = std::nullopt;
  }
  {
    torch::NoGradGuard no_grad;
    source.set_epoch(0);
    while (auto b = source.next()) {
      forward(*b);
    }
  }
  for (auto& [momentum, saved] : momenta) {
    *momentum = saved;
  }
  module.train(was_training);
}

}  // namespace trainkit::train
