#include "trainkit/data/transforms.h"

#include <cmath>

#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::data {
namespace {

void check_images(const at::Tensor& x, const char* what) {
  TRAINKIT_CHECK_ARG(x.defined() && (x.dim() == 3 || x.dim() == 4),
                     "{}: expected images [B, C, H, W] or [B, H, W], got {}", what,
                     x.defined() ? c10::str(x.sizes()) : std::string("an undefined tensor"));
}

// `t` restrided to `format` unless its strides already suggest it. A 1-channel tensor's strides fit both
// NCHW and NHWC, and an op's output may pick either (a gather of a permuted tensor comes out NHWC); the
// model's convolutions follow the batch's suggested format, so each transform returns its input's.
at::Tensor with_format(const at::Tensor& t, at::MemoryFormat format) {
  return t.to(t.options(), /*non_blocking=*/false, /*copy=*/false, format);
}

}  // namespace

at::Tensor normalize(const at::Tensor& x, const std::vector<double>& mean, const std::vector<double>& std) {
  check_images(x, "normalize");
  const int64_t channels = x.dim() == 4 ? x.size(1) : 1;
  TRAINKIT_CHECK_ARG(!mean.empty() && mean.size() == std.size(),
                     "normalize: mean has {} values and std {} (want as many, 1 or {})", mean.size(), std.size(),
                     channels);
  TRAINKIT_CHECK_ARG(mean.size() == 1 || static_cast<int64_t>(mean.size()) == channels,
                     "normalize: {} mean/std values for {} channels", mean.size(), channels);
  for (const double s : std) {
    TRAINKIT_CHECK_ARG(s > 0, "normalize: invalid std: {}", s);
  }
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  if (x.dim() == 4) {
    shape[1] = static_cast<int64_t>(mean.size());
  }
  const auto on_device = torch::TensorOptions().dtype(torch::kFloat64);
  const at::Tensor m = torch::tensor(mean, on_device).to(x.device(), torch::kFloat).view(shape);
  const at::Tensor s = torch::tensor(std, on_device).to(x.device(), torch::kFloat).view(shape);
  at::Tensor y = x.is_floating_point() ? x.to(torch::kFloat).sub(m) : x.to(torch::kFloat).div_(255).sub_(m);
  return with_format(y.div_(s), x.suggest_memory_format());
}

at::Tensor random_crop(const at::Tensor& x, int64_t padding, at::Generator& generator) {
  check_images(x, "random_crop");
  TRAINKIT_CHECK_ARG(padding >= 0, "random_crop: invalid padding: {}", padding);
  if (padding == 0) {
    return x;
  }
  const at::Tensor images = x.dim() == 3 ? x.unsqueeze(1) : x;  // [B, C, H, W]
  const int64_t b = images.size(0);
  const int64_t h = images.size(2);
  const int64_t w = images.size(3);
  const at::Tensor offsets =
      torch::randint(0, 2 * padding + 1, {b, 2}, generator, torch::TensorOptions().dtype(torch::kInt64))
          .to(x.device());
  const auto index_options = torch::TensorOptions().dtype(torch::kInt64).device(x.device());
  // Each sample's rows top..top+H-1 and columns left..left+W-1 of the padded image, gathered in one
  // advanced-indexing op over [B, H+2p, W+2p, C].
  const at::Tensor rows = offsets.select(1, 0).view({b, 1, 1}) + torch::arange(h, index_options).view({1, h, 1});
  const at::Tensor cols = offsets.select(1, 1).view({b, 1, 1}) + torch::arange(w, index_options).view({1, 1, w});
  const at::Tensor batch = torch::arange(b, index_options).view({b, 1, 1});
  const at::Tensor padded = torch::constant_pad_nd(images, {padding, padding, padding, padding}, 0);
  const at::Tensor out = padded.permute({0, 2, 3, 1}).index({batch, rows, cols}).permute({0, 3, 1, 2});
  return x.dim() == 3 ? out.squeeze(1).contiguous() : with_format(out, x.suggest_memory_format());
}

at::Tensor random_horizontal_flip(const at::Tensor& x, double p, at::Generator& generator) {
  check_images(x, "random_horizontal_flip");
  TRAINKIT_CHECK_ARG(p >= 0 && p <= 1, "random_horizontal_flip: invalid p: {}", p);
  const int64_t b = x.size(0);
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[0] = b;
  const at::Tensor flip = torch::rand({b}, generator, torch::TensorOptions().dtype(torch::kFloat64)).lt(p);
  return with_format(torch::where(flip.to(x.device()).view(shape), x.flip({-1}), x), x.suggest_memory_format());
}

at::Tensor random_erasing(const at::Tensor& x, double p, std::tuple<double, double> scale,
                          std::tuple<double, double> ratio, double value, at::Generator& generator) {
  check_images(x, "random_erasing");
  const auto [scale_lo, scale_hi] = scale;
  const auto [ratio_lo, ratio_hi] = ratio;
  TRAINKIT_CHECK_ARG(p >= 0 && p <= 1, "random_erasing: invalid p: {}", p);
  TRAINKIT_CHECK_ARG(scale_lo >= 0 && scale_lo <= scale_hi && scale_hi <= 1,
                     "random_erasing: invalid scale: ({}, {}) (want 0 <= lo <= hi <= 1)", scale_lo, scale_hi);
  TRAINKIT_CHECK_ARG(ratio_lo > 0 && ratio_lo <= ratio_hi && std::isfinite(ratio_hi),
                     "random_erasing: invalid ratio: ({}, {}) (want 0 < lo <= hi)", ratio_lo, ratio_hi);
  const int64_t b = x.size(0);
  const int64_t h = x.size(-2);
  const int64_t w = x.size(-1);
  const double area = static_cast<double>(h * w);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  // torchvision: log_ratio = torch.log(torch.tensor(ratio)), in float32.
  const at::Tensor log_ratio = torch::log(torch::tensor({ratio_lo, ratio_hi}, f32));
  const double log_lo = log_ratio[0].item<double>();
  const double log_hi = log_ratio[1].item<double>();
  // (top, left, height, width) per sample; height 0 leaves the sample as it is.
  std::vector<int64_t> boxes(static_cast<size_t>(4 * b), 0);
  for (int64_t s = 0; s < b; ++s) {
    // `torch.rand(1) < p` compares in float32.
    if (!(torch::rand({1}, generator, f32).item<float>() < static_cast<float>(p))) {
      continue;
    }
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double erase_area = area * torch::empty({1}, f32).uniform_(scale_lo, scale_hi, generator).item<double>();
      const double aspect = torch::exp(torch::empty({1}, f32).uniform_(log_lo, log_hi, generator)).item<double>();
      // Python's round(): halves to even, as std::nearbyint in the default rounding mode.
      const auto eh = static_cast<int64_t>(std::nearbyint(std::sqrt(erase_area * aspect)));
      const auto ew = static_cast<int64_t>(std::nearbyint(std::sqrt(erase_area / aspect)));
      if (!(eh < h && ew < w)) {
        continue;
      }
      const int64_t top = torch::randint(0, h - eh + 1, {1}, generator, i64).item<int64_t>();
      const int64_t left = torch::randint(0, w - ew + 1, {1}, generator, i64).item<int64_t>();
      const auto k = static_cast<size_t>(4 * s);
      boxes[k] = top;
      boxes[k + 1] = left;
      boxes[k + 2] = eh;
      boxes[k + 3] = ew;
      break;
    }
  }
  const at::Tensor box = torch::tensor(boxes, i64).view({b, 4}).to(x.device());
  const auto index_options = i64.device(x.device());
  const at::Tensor rows = torch::arange(h, index_options).view({1, h, 1});
  const at::Tensor cols = torch::arange(w, index_options).view({1, 1, w});
  const at::Tensor top = box.select(1, 0).view({b, 1, 1});
  const at::Tensor left = box.select(1, 1).view({b, 1, 1});
  at::Tensor mask = rows.ge(top) & rows.lt(top + box.select(1, 2).view({b, 1, 1})) & cols.ge(left) &
                    cols.lt(left + box.select(1, 3).view({b, 1, 1}));  // [B, H, W]
  if (x.dim() == 4) {
    mask = mask.unsqueeze(1);
  }
  return with_format(x.masked_fill(mask, value), x.suggest_memory_format());
}

}  // namespace trainkit::data
