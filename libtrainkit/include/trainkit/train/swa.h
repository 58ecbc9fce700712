#pragma once
/// @file
/// Stochastic Weight Averaging (Izmailov et al. 2018, arXiv 1803.05407) with the semantics of
/// `torch.optim.swa_utils`: AveragedModel, SWALR and update_bn. Usable in a hand-written loop; the Trainer
/// hook that runs them is callbacks/stochastic_weight_averaging.h.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "trainkit/data/batch_source.h"
#include "trainkit/sched/scheduler.h"
#include "trainkit/train/task.h"

namespace trainkit::train {

/// The new average of one tensor from the current average, the model's tensor and the number of models
/// averaged so far (PyTorch's `avg_fn`).
using AvgFn = std::function<at::Tensor(const at::Tensor& averaged, const at::Tensor& current, int64_t num_averaged)>;

/// PyTorch's default (equal-weight running mean): averaged + (current - averaged) / (num_averaged + 1).
AvgFn swa_avg_fn();
/// An exponential moving average: decay · averaged + (1 - decay) · current (`get_ema_avg_fn`).
AvgFn ema_avg_fn(double decay = 0.999);

/// PyTorch's AveragedModel: an average of a model's parameters (and, with `use_buffers`, its buffers;
/// else the buffers are copied from the model at each update). The first update copies the model; later
/// ones apply `avg_fn` (swa_avg_fn() when empty) with the count of models averaged so far.
class AveragedModel {
 public:
  AveragedModel(const torch::nn::Module& model, AvgFn avg_fn = {}, bool use_buffers = false);
  /// Averages in the current weights of `model` (PyTorch's `update_parameters`).
  void update_parameters(const torch::nn::Module& model);
  /// Models averaged so far (PyTorch's `n_averaged`).
  int64_t n_averaged() const { return n_averaged_; }
  /// The averaged parameters then buffers (see weight_tensors()).
  const std::vector<at::Tensor>& values() const { return values_; }
  std::vector<at::Tensor>& values() { return values_; }
  /// Writes n_averaged and the averaged tensors.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Restores save()'s state in place.
  void load(torch::serialize::InputArchive& archive);

 private:
  AvgFn avg_fn_;
  bool use_buffers_;
  size_t num_params_ = 0;
  std::vector<at::Tensor> values_;
  int64_t n_averaged_ = 0;
};

/// Options of SWALR; names and defaults are PyTorch's.
struct SWALROptions {
  SWALROptions() = default;
  /// One SWA LR for every param group.
  explicit SWALROptions(double swa_lr) : swa_lr_({swa_lr}) {}
  /// The LR annealed to: one value, or one per param group.
  TORCH_ARG(std::vector<double>, swa_lr);
  /// Epochs of annealing (>= 0).
  TORCH_ARG(int64_t, anneal_epochs) = 10;
  /// "cos" ((1 - cos(π t)) / 2) or "linear" (t).
  TORCH_ARG(std::string, anneal_strategy) = "cos";
};

/// PyTorch's SWALR: anneals each group's LR from its value when annealing began to swa_lr over
/// anneal_epochs steps: lr = swa_lr · α(t) + lr_0 · (1 - α(t)), t = min(1, step / max(1, anneal_epochs)),
/// where lr_0 is recovered from the group's current LR (so that it starts from whatever LR is there).
class SWALR : public sched::LRScheduler {
 public:
  /// Throws std::invalid_argument naming the bad option.
  SWALR(torch::optim::Optimizer& optimizer, SWALROptions options);
  std::string name() const override { return "SWALR"; }

 protected:
  std::vector<double> get_lr() override;

 private:
  double anneal(double t) const;
  SWALROptions options_;
  std::vector<double> swa_lrs_;
};

/// PyTorch's update_bn: resets the running statistics of every BatchNorm{1,2,3}d in `module`, then runs
/// `forward` in train mode without gradients over epoch 0 of `source` with momentum None (a cumulative
/// average), and restores the momenta and the training mode. Does nothing without BatchNorm.
void update_bn(torch::nn::Module& module, const ForwardFn& forward, data::BatchSource& source);

}  // namespace trainkit::train
