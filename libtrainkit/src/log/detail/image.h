#pragma once
// Tensor-to-image conversion of SummaryWriter::add_image, as PyTorch's add_image does it. Internal to
// trainkit::log.

#include <string>

#include "trainkit/log/summary_writer.h"

namespace trainkit::log::detail {

/// Converts a tensor (any device) to an Image as PyTorch's `add_image` does (`convert_to_HWC`, then
/// `_calc_scale_factor`): `dataformats` names the dimensions, an ordering of "HW", "CHW" or "NCHW"
/// ("HWC", "NHWC" ...); N images (1 or 3 channels) are tiled into a grid of at most 8 columns
/// (`make_grid`, zero background); one channel is repeated to RGB. uint8 values are kept; any other dtype is
/// multiplied by 255, clipped to [0, 255] and truncated toward zero (NaN becomes 0). Throws
/// std::invalid_argument naming the shape, `dataformats` or the channel count when they do not fit.
Image make_image(const at::Tensor& tensor, const std::string& dataformats);

}  // namespace trainkit::log::detail
