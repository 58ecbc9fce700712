#pragma once
/// @file
/// Activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost",
/// arXiv 1604.06174): a segment keeps only its inputs in forward and is run again in backward to rebuild
/// the activations its gradient needs. Memory O(√n) for n layers checkpointed in √n segments, for about one
/// extra forward.
///
/// Design (see docs/data_nn.md, "Activation checkpointing"): a custom autograd Function
/// (torch::autograd::Function) whose forward runs the segment with grad disabled and whose backward
/// recomputes it with grad enabled and differentiates it with torch::autograd::grad. This is PyTorch's
/// reentrant checkpoint (`use_reentrant=True`) with two differences:
/// - the segment's parameters are inputs of the Function too, so their gradients come back as the Function's
///   input gradients and are accumulated by the outer backward (their AccumulateGrad nodes run once: DDP's
///   gradient-ready hooks fire once per parameter), and a segment whose inputs do not require grad still
///   gives its parameters gradients (PyTorch's reentrant variant silently gives them none);
/// - buffers the segment updates in place (BatchNorm's running statistics) are restored after the
///   recomputation, so they are updated once, as without checkpointing (PyTorch updates them twice).

#include <cstdint>
#include <functional>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

namespace trainkit::nn {

/// A segment: maps its input tensors to its output tensors. It must be a deterministic function of the
/// inputs, the parameters and buffers given in CheckpointOptions, the RNG state and the autocast state.
using CheckpointFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// Options of checkpoint().
struct CheckpointOptions {
  /// Tensors the segment reads besides its inputs and that need gradients (a module's parameters()).
  /// A tensor that requires grad, is read by the segment and is listed neither here nor among the inputs
  /// gets no gradient from the segment.
  TORCH_ARG(std::vector<at::Tensor>, parameters) = {};
  /// Tensors the segment updates in place (a module's buffers(): BatchNorm's running_mean, running_var,
  /// num_batches_tracked). Their values are saved before the recomputation and written back after it.
  TORCH_ARG(std::vector<at::Tensor>, buffers) = {};
  /// Save the CPU RNG state (and that of every accelerator device an input is on) at forward, and run the
  /// recomputation from it, so dropout draws the same masks; the RNG state after backward is what it was
  /// before. PyTorch's `preserve_rng_state`.
  TORCH_ARG(bool, preserve_rng_state) = true;
};

/// The parameters and buffers of `module` (recursively), as CheckpointOptions.
CheckpointOptions checkpoint_options_for(const torch::nn::Module& module);

/// Runs `fn(inputs)` keeping only `inputs` (and the options' tensors) for backward, and recomputes `fn`
/// during backward. With grad disabled it simply returns fn(inputs). Outputs that are not floating point
/// get no gradient. Autocast's state at forward (enabled, dtype, per CPU and CUDA) is reapplied during the
/// recomputation; autocast's cast cache is off inside the segment (a cast cached under no-grad would have
/// no graph). Not supported: double backward through the segment (create_graph).
std::vector<at::Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options = {});

/// One tensor in, one out: `checkpoint([&](const at::Tensor& x) { return block->forward(x); }, x,
/// checkpoint_options_for(*block))`.
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const CheckpointOptions& options = {});

/// PyTorch's torch.utils.checkpoint.checkpoint_sequential: splits the children of `sequential` into
/// `segments` runs of ⌊n/segments⌋ modules (the last run takes the rest), checkpoints every run but the
/// last (its activations are needed at once by backward) and returns the output. So `segments - 1`
/// recomputations per backward; segments = 1 is a plain forward. Each run's parameters and buffers are
/// passed as in checkpoint_options_for. Requires 1 <= segments <= number of children.
at::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments, const at::Tensor& input,
                                 bool preserve_rng_state = true);

}  // namespace trainkit::nn
