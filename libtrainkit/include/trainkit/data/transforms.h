#pragma once
/// @file
/// Image transforms on whole batches, run on the batch's device (CPU or GPU): normalization of uint8
/// images (so that uint8, a quarter of float32's bytes, is what travels to the GPU) and the usual
/// augmentations with per-sample random decisions drawn from a CPU generator, so that the same generator
/// state gives the same result on any device. Each returns its input's memory format
/// (suggest_memory_format: NCHW or channels-last), which the model's convolutions then follow.
///
///   at::Tensor x = batch.input().to(torch::kCUDA, /*non_blocking=*/true);     // uint8 [B, C, H, W]
///   x = data::random_crop(x, 4, gen);                                       // RandomCrop(32, padding=4)
///   x = data::random_horizontal_flip(x, 0.5, gen);
///   x = data::normalize(x, {0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616});  // float32
///   x = data::random_erasing(x, 0.5, {0.02, 0.33}, {0.3, 3.3}, 0.0, gen);          // RandomErasing()

#include <cstdint>
#include <tuple>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace trainkit::data {

/// (x / 255 - mean[c]) / std[c] per channel c, as float32 on x's device (torchvision's ToTensor then
/// Normalize). `x` is [B, C, H, W] or [B, H, W] (one channel); integer tensors are divided by 255,
/// floating-point ones are taken as already in [0, 1]. `mean` and `std` have C values, or one for all
/// channels. Throws std::invalid_argument for another rank, a channel-count mismatch or a std <= 0.
at::Tensor normalize(const at::Tensor& x, const std::vector<double>& mean, const std::vector<double>& std);

/// torchvision's RandomCrop(size = (H, W), padding) applied per sample: each image is zero-padded by
/// `padding` on every side and cropped back to H x W at an offset (top, left) drawn uniformly from
/// [0, 2 * padding]^2. Offsets are drawn from `generator` (CPU) as one [B, 2] randint tensor (column 0:
/// top, column 1: left). `x` is [B, C, H, W] or [B, H, W], any dtype, on any device; padding 0 returns x.
at::Tensor random_crop(const at::Tensor& x, int64_t padding, at::Generator& generator);

/// torchvision's RandomHorizontalFlip(p) applied per sample: sample b is mirrored along its last
/// (width) dimension when u[b] < p, u = one [B] uniform draw from `generator` (CPU).
at::Tensor random_horizontal_flip(const at::Tensor& x, double p, at::Generator& generator);

/// torchvision's RandomErasing(p, scale, ratio, value) (Zhong et al. 2017) applied to each sample in
/// turn: with probability p, a rectangle of area scale * H * W and aspect ratio h / w (log-uniform in
/// `ratio`) is set to `value` in every channel, at a uniformly drawn position; when 10 tries all give a
/// rectangle as high or as wide as the image, the sample is left unchanged. The draws come from
/// `generator` (CPU) in torchvision's order and dtypes, so torchvision's transform applied to samples
/// 0, 1, ... after torch.manual_seed(s) erases the same rectangles as this call with a generator seeded
/// with s. Any dtype, on any device (one masked_fill); `x` is [B, C, H, W] or [B, H, W]. Throws
/// std::invalid_argument unless 0 <= p <= 1, 0 <= scale.lo <= scale.hi <= 1 and 0 < ratio.lo <= ratio.hi.
at::Tensor random_erasing(const at::Tensor& x, double p, std::tuple<double, double> scale,
                          std::tuple<double, double> ratio, double value, at::Generator& generator);

}  // namespace trainkit::data
