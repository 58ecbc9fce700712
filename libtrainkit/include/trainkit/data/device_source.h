#pragma once
/// @file
/// A BatchSource decorator that moves each batch to a device in one call and preprocesses it there:
/// the loader keeps its batches small (uint8 images, pinned), the device normalizes and augments them.
///
///   data::ParallelLoader loader(n, decode, data::ParallelLoaderOptions().num_workers(4).pin_memory(true));
///   data::DeviceSource source(loader, torch::kCUDA,
///       data::DeviceTransformOptions().crop_padding(4).horizontal_flip(true)
///           .normalize({0.2860}, {0.3530}).seed(0));
///   trainer.fit(source);
///
/// The random decisions of batch b of epoch e come from a CPU generator seeded from (seed, e, b), so a
/// run resumed with set_epoch(e) + skip(b) applies exactly the augmentation it would have applied.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include "trainkit/data/batch_source.h"
#include "trainkit/options.h"

namespace trainkit::data {

/// What DeviceSource does to each batch once it is on the device, in this order: random_crop,
/// random_horizontal_flip, normalize, random_erasing (torchvision's RandomCrop, RandomHorizontalFlip,
/// ToTensor, Normalize, RandomErasing), on one input (the image tensor, [B, C, H, W] or [B, H, W]), then `transform` on the whole batch.
struct DeviceTransformOptions {
  /// A (lo, hi) range.
  using pair_t = std::tuple<double, double>;
  /// Normalizes the image with data::normalize (uint8 -> float32 (x/255 - mean)/std); empty: no normalize.
  DeviceTransformOptions& normalize(std::vector<double> mean, std::vector<double> std) {
    mean_ = std::move(mean);
    std_ = std::move(std);
    return *this;
  }
  const std::vector<double>& mean() const { return mean_; }
  const std::vector<double>& std() const { return std_; }
  /// Padding of data::random_crop (0: no crop).
  TORCH_ARG(int64_t, crop_padding) = 0;
  /// Applies data::random_horizontal_flip with probability `flip_probability`.
  TORCH_ARG(bool, horizontal_flip) = false;
  /// Probability of mirroring each sample when horizontal_flip is on.
  TORCH_ARG(double, flip_probability) = 0.5;
  /// Probability of data::random_erasing per sample (0: off); it runs after normalize, so that value 0
  /// erases to the mean, as torchvision's RandomErasing after Normalize.
  TORCH_ARG(double, erasing_probability) = 0.0;
  /// random_erasing: range of the erased area's fraction of the image.
  TORCH_ARG(pair_t, erasing_scale) = std::make_tuple(0.02, 0.33);
  /// random_erasing: range of the erased rectangle's aspect ratio (height / width).
  TORCH_ARG(pair_t, erasing_ratio) = std::make_tuple(0.3, 3.3);
  /// random_erasing: the value written into the rectangle (in the units of the images at that point).
  TORCH_ARG(double, erasing_value) = 0.0;
  /// Seed of the per-batch generators: batch b of epoch e uses a generator seeded from (seed, e, b).
  TORCH_ARG(uint64_t, seed) = 0;
  /// Position of the image among the batch's inputs (used when `input_name` is empty).
  TORCH_ARG(int64_t, input) = 0;
  /// Name of the image input (see Batch::add_input); takes precedence over `input` when not empty.
  TORCH_ARG(std::string, input_name) = "";
  /// Any further on-device work on the whole batch, after the built-in steps, given the same generator.
  TORCH_ARG(std::function<Batch(Batch, at::Generator&)>, transform) = nullptr;
  /// Copy with non_blocking = true (asynchronous when the source batch is in pinned memory).
  TORCH_ARG(bool, non_blocking) = true;

 public:
  /// The augmentation's keys, rules and help (trainkit/options.h).
  static const OptionBinding<DeviceTransformOptions>& binding() {
    // Padding up to 4096 pixels: a typo is refused naming its key instead of ending in bad_alloc.
    static const auto b = OptionBinding<DeviceTransformOptions>()
        .bind(TRAINKIT_OPTION(crop_padding), rule::integer(0, 4096),
              "Training augmentation: random crop after zero-padding each side by N pixels (0 = off)")
        .bind(TRAINKIT_OPTION(horizontal_flip), rule::boolean(),
              "Training augmentation: random horizontal flip (p = flip_probability, 0.5 by default)")
        .bind(TRAINKIT_OPTION(flip_probability), rule::number(closed_unit_interval()),
              "Probability of mirroring each sample when horizontal_flip is on")
        .bind(TRAINKIT_OPTION(erasing_probability), rule::number(closed_unit_interval()),
              "Training augmentation: random erasing (torchvision's RandomErasing) of each sample with this "
              "probability, after normalization (0 = off)")
        .bind(TRAINKIT_OPTION(erasing_scale),
              range_rule("0 <= lo <= hi <= 1", [](double lo, double hi) { return lo >= 0 && lo <= hi && hi <= 1; }),
              "Random erasing: range of the erased fraction of the image")
        .bind(TRAINKIT_OPTION(erasing_ratio),
              range_rule("0 < lo <= hi", [](double lo, double hi) { return lo > 0 && lo <= hi; }),
              "Random erasing: range of the rectangle's aspect ratio (height / width), drawn log-uniformly")
        .bind(TRAINKIT_OPTION(erasing_value), rule::number({"number"}),
              "Random erasing: the value written (0 = the mean, after normalization)");
    return b;
  }

 private:
  /// A [lo, hi] pair of finite numbers for which `ok(lo, hi)` holds, described by `what`.
  static ValueRule<pair_t> range_rule(const std::string& what, bool (*ok)(double, double)) {
    ValueRule<pair_t> r = rule::number_pair({"number"});
    r.type = "[number, number] with " + what;
    r.expected = "an array of two numbers with " + what;
    r.parse = [parse = r.parse, ok](const ArgValue& v) -> std::optional<pair_t> {
      const auto x = parse(v);
      return x && ok(std::get<0>(*x), std::get<1>(*x)) ? x : std::nullopt;
    };
    return r;
  }

  std::vector<double> mean_;
  std::vector<double> std_;
};

/// Moves every batch of `source` to `device` with one Batch::to(device, non_blocking) call and applies
/// the DeviceTransformOptions' steps there. set_epoch, skip and num_batches forward to the source.
class DeviceSource : public BatchSource {
 public:
  /// Wraps a source that DeviceSource shares ownership of.
  DeviceSource(std::shared_ptr<BatchSource> source, c10::Device device, DeviceTransformOptions options = {});
  /// Wraps a source that the caller keeps alive for as long as the DeviceSource is used (e.g. a
  /// ParallelLoader, which can be neither copied nor moved).
  DeviceSource(BatchSource& source, c10::Device device, DeviceTransformOptions options = {});

  void set_epoch(int64_t epoch) override;
  /// The source's next batch, on the device and transformed; std::nullopt at the end of the epoch.
  std::optional<Batch> next() override;
  int64_t num_batches() const override { return source_->num_batches(); }
  /// Skips in the source (without loading, where the source can) and counts the skipped batches, so the
  /// following batches get the generators they would have had.
  void skip(int64_t count) override;
  /// The target device.
  const c10::Device& device() const { return device_; }
  const DeviceTransformOptions& options() const { return options_; }
  /// The wrapped source (e.g. to ask a ParallelLoader for its options).
  const BatchSource& source() const { return *source_; }

 private:
  std::shared_ptr<BatchSource> source_;
  c10::Device device_;
  DeviceTransformOptions options_;
  int64_t epoch_ = 0;
  int64_t index_ = 0;  // the batch next() returns next
};

}  // namespace trainkit::data
