#include "trainkit/nn/resnet.h"

#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::nn {
namespace {

torch::nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

// He normal (fan_out, ReLU gain) for convolutions, BN weight 1 / bias 0, as torchvision's ResNets; the
// linear classifier keeps LibTorch's default.
void init_weights(torch::nn::Sequential& net, bool zero_init_residual) {
  torch::NoGradGuard no_grad;
  for (auto& m : net->modules(/*include_self=*/false)) {
    if (auto* conv = m->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = m->as<torch::nn::BatchNorm2d>()) {
      bn->weight.fill_(1.0);
      bn->bias.zero_();
    }
  }
  if (zero_init_residual) {
    for (auto& m : net->modules(false)) {
      if (auto* block = m->as<BasicBlock>()) {
        block->bn2->weight.zero_();
      }
    }
  }
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride, bool projection)
    : in_channels_(in_channels), out_channels_(out_channels), stride_(stride) {
  conv1 = register_module("conv1", conv3x3(in_channels, out_channels, stride));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(out_channels));
  conv2 = register_module("conv2", conv3x3(out_channels, out_channels, 1));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(out_channels));
  if (projection && (stride != 1 || in_channels != out_channels)) {
    shortcut_conv = register_module(
        "shortcut_conv",
        torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, out_channels, 1).stride(stride).bias(false)));
    shortcut_bn = register_module("shortcut_bn", torch::nn::BatchNorm2d(out_channels));
  }
}

at::Tensor BasicBlockImpl::forward(const at::Tensor& x) {
  at::Tensor out = torch::relu(bn1->forward(conv1->forward(x)));
  out = bn2->forward(conv2->forward(out));
  at::Tensor shortcut = x;
  if (shortcut_conv) {
    shortcut = shortcut_bn->forward(shortcut_conv->forward(x));
  } else if (stride_ != 1 || in_channels_ != out_channels_) {
    // Option A: subsample, then zero channels for the new ones (split evenly before and after).
    shortcut = x.slice(2, 0, c10::nullopt, stride_).slice(3, 0, c10::nullopt, stride_);
    const int64_t extra = out_channels_ - in_channels_;
    shortcut = torch::constant_pad_nd(shortcut, {0, 0, 0, 0, extra / 2, extra - extra / 2});
  }
  return torch::relu(out + shortcut);
}

torch::nn::Sequential make_cifar_resnet(const ResNetOptions& options) {
  const int64_t depth = options.depth();
  TRAINKIT_CHECK_ARG(depth >= 8 && (depth - 2) % 6 == 0,
                     "make_cifar_resnet: depth must be 6n + 2 (20, 32, 44, 56, 110), got {}", depth);
  TRAINKIT_CHECK_ARG(options.in_channels() > 0 && options.num_classes() > 0,
                     "make_cifar_resnet: invalid in_channels {} or num_classes {}", options.in_channels(),
                     options.num_classes());
  const int64_t n = (depth - 2) / 6;
  torch::nn::Sequential net;
  net->push_back("stem_conv", conv3x3(options.in_channels(), 16, 1));
  net->push_back("stem_bn", torch::nn::BatchNorm2d(16));
  net->push_back("stem_relu", torch::nn::ReLU());
  int64_t in = 16;
  for (const int64_t width : {16, 32, 64}) {
    for (int64_t b = 0; b < n; ++b) {
      const int64_t stride = (b == 0 && width != 16) ? 2 : 1;
      net->push_back(BasicBlock(in, width, stride, /*projection=*/false));
      in = width;
    }
  }
  net->push_back("pool", torch::nn::AdaptiveAvgPool2d(1));
  net->push_back("flatten", torch::nn::Flatten());
  net->push_back("fc", torch::nn::Linear(64, options.num_classes()));
  init_weights(net, options.zero_init_residual());
  return net;
}

torch::nn::Sequential make_resnet18(const ResNetOptions& options) {
  TRAINKIT_CHECK_ARG(options.in_channels() > 0 && options.num_classes() > 0,
                     "make_resnet18: invalid in_channels {} or num_classes {}", options.in_channels(),
                     options.num_classes());
  torch::nn::Sequential net;
  net->push_back("stem_conv", conv3x3(options.in_channels(), 64, 1));
  net->push_back("stem_bn", torch::nn::BatchNorm2d(64));
  net->push_back("stem_relu", torch::nn::ReLU());
  int64_t in = 64;
  for (const int64_t width : {64, 128, 256, 512}) {
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t stride = (b == 0 && width != 64) ? 2 : 1;
      net->push_back(BasicBlock(in, width, stride, /*projection=*/true));
      in = width;
    }
  }
  net->push_back("pool", torch::nn::AdaptiveAvgPool2d(1));
  net->push_back("flatten", torch::nn::Flatten());
  net->push_back("fc", torch::nn::Linear(512, options.num_classes()));
  init_weights(net, options.zero_init_residual());
  return net;
}

}  // namespace trainkit::nn
