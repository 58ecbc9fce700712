#pragma once
/// @file
/// Gradient clipping with the semantics of `torch.nn.utils.clip_grad_norm_` / `clip_grad_value_`.
/// Contiguous float32/float64 CPU gradients take a fused path: one multithreaded pass over all of them
/// for the norm (no per-tensor dispatch), and a rescale pass only when clipping is needed. Everything
/// else (CUDA, other dtypes) goes through ATen's foreach ops without a host sync.

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

namespace trainkit::grad {

/// Clips the gradients of `parameters` in place so that their total `norm_type` norm is at most
/// `max_norm`: g ← g · min(1, max_norm / (total_norm + 1e-6)). norm_type may be any p > 0 or infinity.
/// Returns the total norm before clipping as a 0-dim tensor (reading it is the only host sync on GPUs).
/// With `error_if_nonfinite`, a NaN/inf total norm throws std::runtime_error naming the first
/// parameter (by index) whose gradient is non-finite. Parameters without a gradient are skipped.
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0,
                           bool error_if_nonfinite = false);

/// Same, naming the culprit by its parameter name (e.g. `module->named_parameters()`).
at::Tensor clip_grad_norm_(const torch::OrderedDict<std::string, at::Tensor>& named_parameters, double max_norm,
                           double norm_type = 2.0, bool error_if_nonfinite = false);

/// The scaling half of clip_grad_norm_ for a total norm computed elsewhere (e.g. over every rank's shard):
/// g ← g · min(1, max_norm / (total_norm + 1e-6)), as `torch.nn.utils.clip_grads_with_norm_`.
void clip_grads_with_norm_(const std::vector<at::Tensor>& parameters, double max_norm, const at::Tensor& total_norm);

/// The total `norm_type` norm of the gradients of `parameters`, without clipping.
at::Tensor grad_norm(const std::vector<at::Tensor>& parameters, double norm_type = 2.0);

/// Clamps every gradient element to [-clip_value, clip_value] in place (clip_value >= 0).
void clip_grad_value_(const std::vector<at::Tensor>& parameters, double clip_value);

}  // namespace trainkit::grad
