#include "log/detail/image.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

namespace trainkit::log::detail {
namespace {

/// numpy's transpose by the positions of `target`'s letters in `format` (as convert_to_HWC does).
at::Tensor to_layout(const at::Tensor& t, const std::string& format, const std::string& target) {
  std::vector<int64_t> order;
  for (char c : target) {
    order.push_back(static_cast<int64_t>(format.find(c)));
  }
  return t.permute(order);
}

}  // namespace

Image make_image(const at::Tensor& tensor, const std::string& dataformats) {
  std::string format = dataformats;
  std::transform(format.begin(), format.end(), format.begin(), [](unsigned char c) { return std::toupper(c); });
  const std::string letters = format.size() == 2 ? "HW" : format.size() == 3 ? "HWC" : "NCHW";
  std::string sorted_format = format;
  std::string sorted_letters = letters;
  std::sort(sorted_format.begin(), sorted_format.end());
  std::sort(sorted_letters.begin(), sorted_letters.end());
  if (format.size() < 2 || format.size() > 4 || sorted_format != sorted_letters) {
    throw std::invalid_argument(fmt::format(
        "make_image: invalid dataformats \"{}\" (an ordering of HW, CHW or NCHW, e.g. \"CHW\", \"HWC\")", dataformats));
  }
  if (!tensor.defined() || tensor.dim() != static_cast<int64_t>(format.size())) {
    throw std::invalid_argument(fmt::format("make_image: a tensor of shape {} does not match dataformats \"{}\"",
                                            tensor.defined() ? fmt::format("{}", fmt::join(tensor.sizes(), "x")) : "(undefined)",
                                            dataformats));
  }
  if (tensor.numel() == 0) {
    throw std::invalid_argument(fmt::format("make_image: the tensor of shape {} is empty", fmt::join(tensor.sizes(), "x")));
  }
  at::Tensor hwc;
  if (format.size() == 4) {
    // make_grid: N images side by side, at most 8 per row, on a zero canvas.
    at::Tensor nchw = to_layout(tensor, format, "NCHW");
    if (nchw.size(1) == 1) {
      nchw = nchw.expand({-1, 3, -1, -1});
    }
    if (nchw.size(1) != 3) {
      throw std::invalid_argument(fmt::format("make_image: a batch of images needs 1 or 3 channels, got {} (shape {})",
                                              nchw.size(1), fmt::join(tensor.sizes(), "x")));
    }
    const int64_t n = nchw.size(0);
    const int64_t h = nchw.size(2);
    const int64_t w = nchw.size(3);
    const int64_t ncols = std::min<int64_t>(n, 8);
    const int64_t nrows = (n + ncols - 1) / ncols;
    at::Tensor canvas = torch::zeros({3, h * nrows, w * ncols}, nchw.options());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t y = i / ncols;
      const int64_t x = i % ncols;
      canvas.narrow(1, y * h, h).narrow(2, x * w, w).copy_(nchw[i]);
    }
    hwc = canvas.permute({1, 2, 0});
  } else if (format.size() == 3) {
    hwc = to_layout(tensor, format, "HWC");
    if (hwc.size(2) == 1) {
      hwc = hwc.expand({-1, -1, 3});
    }
  } else {
    hwc = to_layout(tensor, format, "HW").unsqueeze(2).expand({-1, -1, 3});
  }
  const int64_t channels = hwc.size(2);
  if (channels != 3 && channels != 4) {
    throw std::invalid_argument(fmt::format("make_image: {} channels (need 1, 3 or 4) in a tensor of shape {}",
                                            channels, fmt::join(tensor.sizes(), "x")));
  }
  at::Tensor bytes;
  if (hwc.scalar_type() == torch::kByte) {
    bytes = hwc;
  } else {
    // _calc_scale_factor: anything but uint8 is taken to be in [0, 1].
    bytes = torch::nan_to_num(hwc.to(torch::kFloat32) * 255.0F, 0.0).clamp(0.0, 255.0).to(torch::kByte);
  }
  bytes = bytes.to(torch::kCPU).contiguous();
  Image image;
  image.height = bytes.size(0);
  image.width = bytes.size(1);
  image.channels = channels;
  const auto* p = bytes.data_ptr<uint8_t>();
  image.pixels.assign(p, p + bytes.numel());
  return image;
}

}  // namespace trainkit::log::detail
