#pragma once
/// @file
/// Small reference models for the demos and the `trainkit train` job.

#include <cstdint>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include "trainkit/options.h"

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

 public:
  /// Every field's key, rule and help (trainkit/options.h).
  static const OptionBinding<CnnOptions>& binding() {
    // Widths up to 2^20 (2^20 x 784 float32 weights = 3 GiB): a typo (an extra zero or three) is refused
    // naming its key instead of ending in bad_alloc.
    constexpr int64_t max_width = int64_t{1} << 20;
    static const auto b = OptionBinding<CnnOptions>()
        .bind(TRAINKIT_OPTION(in_channels), rule::integer(1, max_width), "Input channels")
        .bind(TRAINKIT_OPTION(image_size), rule::integer(1, max_width), "Input height and width")
        .bind(TRAINKIT_OPTION(channels), rule::integers(1, max_width),
              "cnn: output channels of each 3x3 conv block (each halves the resolution)")
        .bind(TRAINKIT_OPTION(hidden), rule::integer(1, max_width), "Width of the hidden fully connected layer")
        .bind(TRAINKIT_OPTION(dropout), rule::number(unit_interval()), "Dropout before each fully connected layer")
        .bind(TRAINKIT_OPTION(batch_norm), rule::boolean(), "cnn: batch normalization after each convolution")
        .bind(TRAINKIT_OPTION(num_classes), rule::integer(1), "Number of classes");
    return b;
  }
};

/// A conv net: [conv3x3 → (BN) → maxpool2 → ReLU] per entry of `channels` (the same function as ReLU before
/// the pooling, at a quarter of the ReLU's cost), then flatten → dropout → linear(hidden) → ReLU → dropout →
/// linear(num_classes). Returns logits. ReLU and pooling hold no parameters: the state dict does not depend on
/// their order.
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
