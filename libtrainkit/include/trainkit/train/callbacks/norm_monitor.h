#pragma once
/// @file
/// Per-parameter gradient and weight norms every N steps (what Lightning's `log_grad_norm`/
/// `grad_norm(module, norm_type)` and the usual "weights and gradients by layer" dashboards show): to a
/// long-format CSV, to TensorBoard, and to the caller.

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include "trainkit/log/summary_writer.h"
#include "trainkit/train/callback.h"

namespace trainkit::train {

/// One parameter's norms at a step.
struct ParameterNorms {
  std::string name;   ///< the parameter's name in the module ("0.weight", "layer1.0.conv1.weight", ...)
  double grad_norm;   ///< 2-norm of its gradient (unscaled when a GradScaler is in use); NaN without one
  double param_norm;  ///< 2-norm of the parameter before the step
};

/// Options of NormMonitor.
struct NormMonitorOptions {
  /// Steps between measurements: steps every_steps, 2·every_steps, ... are measured.
  TORCH_ARG(int64_t, every_steps) = 100;
  /// When not empty, rows `step,name,grad_norm,param_norm` are written to this CSV (flushed each time).
  TORCH_ARG(std::string, csv_path);
  /// Append to an existing CSV (a resumed run) instead of replacing it.
  TORCH_ARG(bool, append) = false;
};

/// A Trainer hook that measures the 2-norm of every parameter's gradient and value just before the
/// optimizer step (Callback::on_before_optimizer_step) every `every_steps` steps: one device-to-host read
/// per measurement, none in between. Gradients still multiplied by a GradScaler's scale are divided by it.
/// TensorBoard tags: `norms/grad/<name>` and `norms/param/<name>`.
class NormMonitor : public Callback {
 public:
  /// Measures `module`'s parameters (by their names there). `tensorboard` may be null. Throws
  /// std::runtime_error naming the CSV when it cannot be opened, std::invalid_argument for bad options.
  NormMonitor(const torch::nn::Module& module, NormMonitorOptions options,
             std::shared_ptr<log::SummaryWriter> tensorboard = nullptr);
  void on_before_optimizer_step(Trainer& trainer) override;

  /// The last measurement (empty before the first).
  const std::vector<ParameterNorms>& last() const { return last_; }
  /// The step of the last measurement (0 before the first).
  int64_t last_step() const { return last_step_; }

 private:
  std::vector<std::pair<std::string, at::Tensor>> params_;
  NormMonitorOptions options_;
  std::shared_ptr<log::SummaryWriter> tensorboard_;
  std::ofstream csv_;
  std::vector<ParameterNorms> last_;
  int64_t last_step_ = 0;
};

}  // namespace trainkit::train
