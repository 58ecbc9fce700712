#include "trainkit/data/transforms.h"

#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::data {
namespace {

void check_images(const at::Tensor& x, const char* what) {
  TRAINKIT_CHECK_ARG(x.defined() && (x.dim() == 3 || x.dim() == 4),
                     "{}: expected images [B, C, H, W] or [B, H, W], got {}", what,
                     x.defined() ? c10::str(x.sizes()) : std::string("an undefined tensor"));
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
  return y.div_(s);
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
  at::Tensor out = padded.permute({0, 2, 3, 1}).index({batch, rows, cols}).permute({0, 3, 1, 2}).contiguous();
  return x.dim() == 3 ? out.squeeze(1) : out;
}

at::Tensor random_horizontal_flip(const at::Tensor& x, double p, at::Generator& generator) {
  check_images(x, "random_horizontal_flip");
  TRAINKIT_CHECK_ARG(p >= 0 && p <= 1, "random_horizontal_flip: invalid p: {}", p);
  const int64_t b = x.size(0);
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[0] = b;
  const at::Tensor flip = torch::rand({b}, generator, torch::TensorOptions().dtype(torch::kFloat64)).lt(p);
  return torch::where(flip.to(x.device()).view(shape), x.flip({-1}), x);
}

}  // namespace trainkit::data
