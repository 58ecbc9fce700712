#include "trainkit/data/device_source.h"

#include <algorithm>
#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "data/detail/epoch_order.h"
#include "detail/check.h"
#include "trainkit/data/transforms.h"

namespace trainkit::data {
namespace {

// `batch` with input `position` replaced by `tensor` (names kept).
Batch replace_input(const Batch& batch, size_t position, at::Tensor tensor) {
  Batch out;
  for (size_t i = 0; i < batch.inputs().size(); ++i) {
    out.add_input(i == position ? tensor : batch.inputs()[i], batch.input_names()[i]);
  }
  for (size_t i = 0; i < batch.targets().size(); ++i) {
    out.add_target(batch.targets()[i], batch.target_names()[i]);
  }
  return out;
}

}  // namespace

DeviceSource::DeviceSource(std::shared_ptr<BatchSource> source, c10::Device device, DeviceTransformOptions options)
    : source_(std::move(source)), device_(device), options_(std::move(options)) {
  TRAINKIT_CHECK_ARG(source_ != nullptr, "DeviceSource: no source");
  TRAINKIT_CHECK_ARG(options_.crop_padding() >= 0, "DeviceSource: invalid crop_padding: {}", options_.crop_padding());
  TRAINKIT_CHECK_ARG(options_.flip_probability() >= 0 && options_.flip_probability() <= 1,
                     "DeviceSource: invalid flip_probability: {}", options_.flip_probability());
  TRAINKIT_CHECK_ARG(options_.mean().size() == options_.std().size(),
                     "DeviceSource: normalize has {} mean values but {} std values", options_.mean().size(),
                     options_.std().size());
  for (const double s : options_.std()) {
    TRAINKIT_CHECK_ARG(s > 0, "DeviceSource: invalid normalize std: {}", s);
  }
  TRAINKIT_CHECK_ARG(options_.erasing_probability() >= 0 && options_.erasing_probability() <= 1,
                     "DeviceSource: invalid erasing_probability: {}", options_.erasing_probability());
  const auto [scale_lo, scale_hi] = options_.erasing_scale();
  TRAINKIT_CHECK_ARG(scale_lo >= 0 && scale_lo <= scale_hi && scale_hi <= 1,
                     "DeviceSource: invalid erasing_scale: ({}, {}) (want 0 <= lo <= hi <= 1)", scale_lo, scale_hi);
  const auto [ratio_lo, ratio_hi] = options_.erasing_ratio();
  TRAINKIT_CHECK_ARG(ratio_lo > 0 && ratio_lo <= ratio_hi && std::isfinite(ratio_hi),
                     "DeviceSource: invalid erasing_ratio: ({}, {}) (want 0 < lo <= hi)", ratio_lo, ratio_hi);
  TRAINKIT_CHECK_ARG(options_.input() >= 0, "DeviceSource: invalid input: {}", options_.input());
}

DeviceSource::DeviceSource(BatchSource& source, c10::Device device, DeviceTransformOptions options)
    : DeviceSource(std::shared_ptr<BatchSource>(&source, [](BatchSource*) {}), device, std::move(options)) {}

void DeviceSource::set_epoch(int64_t epoch) {
  source_->set_epoch(epoch);
  epoch_ = epoch;
  index_ = 0;
}

void DeviceSource::skip(int64_t count) {
  TRAINKIT_CHECK_ARG(count >= 0, "DeviceSource::skip: invalid count: {}", count);
  source_->skip(count);
  index_ += count;
}

std::optional<Batch> DeviceSource::next() {
  std::optional<Batch> batch = source_->next();
  if (!batch) {
    return std::nullopt;
  }
  const int64_t index = index_++;
  Batch out = batch->to(device_, options_.non_blocking());
  const bool image_steps = options_.crop_padding() > 0 || options_.horizontal_flip() || !options_.mean().empty() ||
                           options_.erasing_probability() > 0;
  if (!image_steps && !options_.transform()) {
    return out;
  }
  const uint64_t seed = detail::derive_seed(options_.seed(), detail::SeedStream::kDeviceBatch, epoch_, index);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  if (image_steps) {
    size_t position = static_cast<size_t>(options_.input());
    if (!options_.input_name().empty()) {
      out.input(options_.input_name());  // throws std::out_of_range listing the names there are
      const auto& names = out.input_names();
      position = static_cast<size_t>(std::find(names.begin(), names.end(), options_.input_name()) - names.begin());
    }
    at::Tensor x = out.input(position);
    if (options_.crop_padding() > 0) {
      x = random_crop(x, options_.crop_padding(), generator);
    }
    if (options_.horizontal_flip()) {
      x = random_horizontal_flip(x, options_.flip_probability(), generator);
    }
    if (!options_.mean().empty()) {
      x = normalize(x, options_.mean(), options_.std());
    }
    if (options_.erasing_probability() > 0) {
      x = random_erasing(x, options_.erasing_probability(), options_.erasing_scale(), options_.erasing_ratio(),
                         options_.erasing_value(), generator);
    }
    out = replace_input(out, position, std::move(x));
  }
  if (options_.transform()) {
    out = options_.transform()(std::move(out), generator);
  }
  return out;
}

}  // namespace trainkit::data
