#pragma once
/// @file
/// A model summary printed at the start of a run (as Keras' `model.summary()`, Lightning's
/// `ModelSummary`, torchinfo): layers, output shapes, parameter counts and size in bytes.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

namespace trainkit::train {

/// One row of a ModelSummary.
struct LayerSummary {
  std::string name;                   ///< the child's name ("0", "1", ... in a Sequential)
  std::string type;                   ///< the module's name(), e.g. "torch::nn::Conv2d"
  std::vector<int64_t> output_shape;  ///< shape of its output on the example (empty when not run)
  int64_t params = 0;                 ///< parameters it holds (all of its descendants')
  int64_t trainable_params = 0;       ///< of which require grad
};

/// What summary() found.
struct ModelSummary {
  std::vector<LayerSummary> layers;  ///< direct children, in order
  int64_t params = 0;                ///< parameters of the whole module
  int64_t trainable_params = 0;      ///< of which require grad
  int64_t param_bytes = 0;           ///< bytes of the parameters (numel × element size)
  int64_t buffer_bytes = 0;          ///< bytes of the buffers (BatchNorm statistics, ...)
  /// A table: one line per layer (name, type, output shape, parameters) and the totals.
  std::string to_string() const;
};

/// Summarizes `module`'s direct children and totals, without an example.
ModelSummary summary(const torch::nn::Module& module);

/// Same, with each child's output shape: the children of `model` run one after another on `example`
/// (batch dimension included) in eval mode without gradients; the module's mode is restored.
ModelSummary summary(torch::nn::Sequential& model, const at::Tensor& example);

}  // namespace trainkit::train
