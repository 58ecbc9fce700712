#pragma once
/// @file
/// The LR range test (Smith 2017, arXiv 1506.01186) with torch-lr-finder's semantics: the LR grows
/// exponentially (or linearly) from start_lr to end_lr over num_iter steps while the loss is recorded,
/// smoothed, and the test stops when it diverges. Model, optimizer and RNG state are restored afterwards.
/// With set_autocast() and set_grad_scaler() it runs in mixed precision as torch-lr-finder's
/// `amp_backend="torch"` does, and records the steps the GradScaler skips.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "trainkit/amp/grad_scaler.h"
#include "trainkit/data/batch_source.h"
#include "trainkit/train/task.h"

namespace trainkit::tune {

/// Options of the range test (torch-lr-finder's names and defaults; start_lr is fastai's 1e-7).
struct LRFinderOptions {
  /// First LR (> 0).
  TORCH_ARG(double, start_lr) = 1e-7;
  /// Last LR (> start_lr).
  TORCH_ARG(double, end_lr) = 10.0;
  /// Steps of the test (>= 2).
  TORCH_ARG(int64_t, num_iter) = 100;
  /// "exp" (lr_i = start · (end/start)^(i/(n-1))) or "linear".
  TORCH_ARG(std::string, step_mode) = "exp";
  /// Loss smoothing: s_i = f · loss_i + (1 - f) · s_{i-1} (in [0, 1)).
  TORCH_ARG(double, smooth_f) = 0.05;
  /// Stop when the smoothed loss exceeds diverge_th × the best smoothed loss (> 1).
  TORCH_ARG(double, diverge_th) = 5.0;
  /// Micro-batches per step (the loss of each is divided by this).
  TORCH_ARG(int64_t, accumulation_steps) = 1;
};

/// What the range test recorded, one entry per completed step.
///
/// A step the GradScaler skipped (inf/NaN gradients: the optimizer did not step, the weights kept their
/// values) is marked in `skipped`. Its loss was measured like any other (on the weights before the step),
/// so it enters the smoothing and the divergence check as in torch-lr-finder; a skip alone never stops
/// the test, since backing off after an overflow is the scaler calibrating itself.
struct LRFinderResult {
  std::vector<double> lrs;
  std::vector<double> losses;           ///< raw loss of each step (validation loss with a val loader)
  std::vector<double> smoothed_losses;  ///< torch-lr-finder's history["loss"]
  std::vector<bool> skipped;            ///< the GradScaler skipped this step (always false without one)
  std::vector<double> scales;           ///< the loss scale of this step's backward (1 without a GradScaler)
  bool diverged = false;                ///< stopped early by diverge_th

  /// How many steps the GradScaler skipped.
  int64_t skipped_steps() const;
};

/// A suggested LR and where it comes from.
struct Suggestion {
  double lr = 0;
  int64_t index = 0;   ///< into the result's vectors
  std::string method;  ///< "steepest", "valley" or "minimum/10"
};

/// torch-lr-finder's suggestion: the LR where the smoothed loss falls fastest (numpy.gradient, central
/// differences) after dropping skip_start first and skip_end last points. std::nullopt with `why` set
/// when there are too few points or no descent at all.
std::optional<Suggestion> suggest_steepest(const LRFinderResult& r, std::string* why = nullptr,
                                           int64_t skip_start = 10, int64_t skip_end = 5);
/// fastai's `valley`: the middle of the longest decreasing run of the smoothed loss, shifted toward its
/// start. std::nullopt (with `why`) when the curve has fewer than 2 points.
std::optional<Suggestion> suggest_valley(const LRFinderResult& r, std::string* why = nullptr);
/// The LR of the minimum smoothed loss, divided by 10 (fastai's `minimum`), never below the tested range.
std::optional<Suggestion> suggest_minimum(const LRFinderResult& r, std::string* why = nullptr);

/// Runs range tests on a model with any torch::optim::Optimizer.
class LRFinder {
 public:
  using ForwardFn = train::ForwardFn;
  using LossFn = train::LossFn;

  /// `forward` maps a batch to the output; the loss defaults to cross-entropy.
  LRFinder(std::shared_ptr<torch::nn::Module> module, ForwardFn forward, torch::optim::Optimizer& optimizer,
           LossFn loss = nullptr);
  /// Convenience for module holders with a `forward(Tensor)`: the forward runs on the batch's input 0.
  template <class Holder>
  LRFinder(Holder model, torch::optim::Optimizer& optimizer, LossFn loss = nullptr)
      : LRFinder(model.ptr(), train::forward_first_input(model), optimizer, std::move(loss)) {}

  /// Runs each step's forward and loss under autocast to `dtype` on `device` (torch-lr-finder's
  /// `amp_config`); a float16 or bfloat16 loss is taken in float32, as the Trainer does. Validation runs
  /// without autocast, as torch-lr-finder's does. Throws std::invalid_argument when autocast does not
  /// support `dtype` on `device` (amp::is_autocast_dtype_supported()).
  void set_autocast(c10::DeviceType device, c10::ScalarType dtype);
  /// Backward of scaler->scale(loss) for each micro-batch, then scaler->step() and scaler->update() once
  /// per step (torch-lr-finder's `grad_scaler`); a step it skips is recorded in LRFinderResult::skipped.
  /// The scaler's state (scale, growth tracker) is restored after the test with the model's. Null: none.
  void set_grad_scaler(std::shared_ptr<amp::GradScaler> scaler) { scaler_ = std::move(scaler); }

  /// Runs the test over consecutive batches of `train` from epoch 0 (continuing into epochs 1, 2, ...
  /// when one epoch is too short); with `val`, the recorded loss of each step is the mean validation
  /// loss over epoch 0 of `val`. Parameters, buffers, optimizer state (LRs included) and every device's
  /// default generator (the CPU's, each GPU's) are restored bitwise afterwards (the GradScaler's state
  /// too), also when the test throws. Throws
  /// std::invalid_argument when a source yields no batch, or when the GradScaler is in the middle of an
  /// iteration of this optimizer (call its update() first).
  LRFinderResult range_test(data::BatchSource& train, data::BatchSource* val = nullptr,
                            const LRFinderOptions& options = {});

 private:
  std::shared_ptr<torch::nn::Module> module_;
  ForwardFn forward_;
  torch::optim::Optimizer& optimizer_;
  LossFn loss_;
  std::optional<std::pair<c10::DeviceType, c10::ScalarType>> autocast_;
  std::shared_ptr<amp::GradScaler> scaler_;
};

/// Writes `lr,loss,smoothed_loss,skipped,scale` rows (skipped: 1 where the GradScaler skipped the step).
void write_lr_finder_csv(const LRFinderResult& r, const std::string& path);
/// Draws the smoothed loss against the LR (log x) with the suggestions marked.
void write_lr_finder_svg(const LRFinderResult& r, const std::vector<Suggestion>& suggestions,
                         const std::string& path, const std::string& title = "LR range test");

}  // namespace trainkit::tune
