#pragma once
/// @file
/// Residual networks for small images: the CIFAR ResNets of He et al. 2016 ("Deep Residual Learning for
/// Image Recognition", section 4.2: ResNet-20/32/44/56/110, 3 stages of 16/32/64 channels, identity
/// shortcuts that subsample and zero-pad the channels, "option A") and ResNet-18 with a small-image stem
/// (a 3x3 stride-1 convolution, no max pooling; 1x1 convolution shortcuts where the shape changes).
///
///     auto net = trainkit::nn::make_cifar_resnet(trainkit::nn::ResNetOptions().depth(20).in_channels(1));
///     at::Tensor logits = net->forward(images);   // [N, C, H, W] → [N, num_classes]
///
/// Both are a torch::nn::Sequential (stem, residual blocks, pooling, classifier), so summaries, per-child
/// checkpointing (nn::checkpoint_sequential) and init rules by name work on them like on the CNN.

#include <cstdint>
#include <optional>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include "trainkit/options.h"

namespace trainkit::nn {

/// Options of make_cifar_resnet and make_resnet18.
struct ResNetOptions {
  /// CIFAR ResNets: 6n + 2 layers (20, 32, 44, 56, 110); ignored by make_resnet18.
  TORCH_ARG(int64_t, depth) = 20;
  /// Input channels (1 for Fashion-MNIST, 3 for CIFAR-10).
  TORCH_ARG(int64_t, in_channels) = 3;
  /// Number of classes.
  TORCH_ARG(int64_t, num_classes) = 10;
  /// Start every residual branch's last BatchNorm at weight 0 (Goyal et al. 2017), so that each block
  /// begins as the identity.
  TORCH_ARG(bool, zero_init_residual) = false;

 public:
  /// Every field's key, rule and help (trainkit/options.h); `depth` takes 6n + 2 only.
  static const OptionBinding<ResNetOptions>& binding() {
    static const auto b = OptionBinding<ResNetOptions>()
        .bind(TRAINKIT_OPTION(depth), depth_rule(), "resnet: layers (20, 32, 44, 56, 110)")
        .bind(TRAINKIT_OPTION(in_channels), rule::integer(1), "Input channels")
        .bind(TRAINKIT_OPTION(num_classes), rule::integer(1), "Number of classes")
        .bind(TRAINKIT_OPTION(zero_init_residual), rule::boolean(),
              "resnet, resnet18: start each residual branch's last BatchNorm at 0");
    return b;
  }

 private:
  /// A CIFAR ResNet depth: 6n + 2 with n >= 1.
  static ValueRule<int64_t> depth_rule() {
    ValueRule<int64_t> r = rule::integer(8);
    r.type = "integer 6n + 2";
    r.expected = "an integer 6n + 2 (20, 32, 44, 56, 110)";
    r.parse = [](const ArgValue& v) -> std::optional<int64_t> {
      const auto* i = v.get_if<int64_t>();
      return i != nullptr && *i >= 8 && (*i - 2) % 6 == 0 ? std::optional<int64_t>(*i) : std::nullopt;
    };
    return r;
  }
};

/// A basic residual block: conv3x3 → BN → ReLU → conv3x3 → BN, plus the shortcut, then ReLU. Children are
/// named conv1, bn1, conv2, bn2 and (projection shortcuts) shortcut_conv, shortcut_bn.
class BasicBlockImpl : public torch::nn::Module {
 public:
  /// `projection`: a 1x1 convolution + BN shortcut where the shape changes (ResNet-18); otherwise the
  /// shortcut subsamples by `stride` and pads the new channels with zeros (He et al.'s option A).
  BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride, bool projection);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, shortcut_conv{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, shortcut_bn{nullptr};

 private:
  int64_t in_channels_;
  int64_t out_channels_;
  int64_t stride_;
};
TORCH_MODULE(BasicBlock);

/// He et al.'s CIFAR ResNet of `depth` = 6n + 2 layers (n blocks per stage of 16, 32, 64 channels), global
/// average pooling and a linear classifier. Convolutions are initialized with He's normal init (fan_out,
/// ReLU gain), BatchNorm with weight 1 and bias 0. Throws std::invalid_argument when depth is not 6n + 2.
/// ResNet-20 has 269,722 parameters for 10 classes (the paper's 0.27M).
torch::nn::Sequential make_cifar_resnet(const ResNetOptions& options = {});

/// ResNet-18 (2 blocks per stage of 64, 128, 256, 512 channels) with a 3x3 stride-1 stem and no max
/// pooling, for 28x28 / 32x32 images; projection shortcuts; the same init as make_cifar_resnet.
/// 11,173,962 parameters for 3 input channels and 10 classes.
torch::nn::Sequential make_resnet18(const ResNetOptions& options = {});

}  // namespace trainkit::nn
