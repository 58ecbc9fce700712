#pragma once
/// @file
/// Small reference models for the demos and the `trainkit train` job.

#include <cstdint>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

namespace trainkit::nn {

/// Options of make_cnn.
struct CnnOptions {
  /// Input channels (1 for Fashion-MNIST).
  TORCH_ARG(int64_t, in_channels) = 1;
  /// Input height and width (square images).
  TORCH_ARG(int64_t, image_size) = 28;
  /// Output channels of each 3x3 conv block; each block halves the resolution with 2x2 max pooling.
  TORCH_ARG(std::vector<int64_t>, channels) = std::vector<int64_t>{32, 64};
  /// Width of the hidden fully connected layer.
  TORCH_ARG(int64_t, hidden) = 128;
  /// Dropout probability before each fully connected layer.
  TORCH_ARG(double, dropout) = 0.25;
  /// Batch normalization after each convolution.
  TORCH_ARG(bool, batch_norm) = true;
  /// Number of classes.
  TORCH_ARG(int64_t, num_classes) = 10;
};

/// A conv net: [conv3x3 → (BN) → ReLU → maxpool2] per entry of `channels`, then
/// flatten → dropout → linear(hidden) → ReLU → dropout → linear(num_classes). Returns logits.
torch::nn::Sequential make_cnn(const CnnOptions& options = {});

/// Options of make_mlp.
struct MlpOptions {
  /// Flattened input size.
  TORCH_ARG(int64_t, in_features) = 784;
  /// Hidden layer widths.
  TORCH_ARG(std::vector<int64_t>, hidden) = std::vector<int64_t>{256};
  /// Dropout after each hidden layer.
  TORCH_ARG(double, dropout) = 0.0;
  /// Number of classes.
  TORCH_ARG(int64_t, num_classes) = 10;
};

/// An MLP: flatten → [linear → ReLU → (dropout)] per hidden width → linear(num_classes). Returns logits.
torch::nn::Sequential make_mlp(const MlpOptions& options = {});

}  // namespace trainkit::nn
