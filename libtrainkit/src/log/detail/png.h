#pragma once
// PNG encoding through libpng for SummaryWriter's images, and the decoder that lets tests read them back.
// Internal to trainkit::log.

#include <string>

#include "trainkit/log/summary_writer.h"

namespace trainkit::log::detail {

/// PNG bytes of `image` (8-bit gray, RGB or RGBA, no interlacing). Throws std::invalid_argument for a
/// bad shape and std::runtime_error if libpng fails.
std::string encode_png(const Image& image);
/// Decodes 8-bit gray, RGB or RGBA PNG bytes (the inverse of encode_png). Throws std::runtime_error
/// for anything else.
Image decode_png(const std::string& png);

}  // namespace trainkit::log::detail
