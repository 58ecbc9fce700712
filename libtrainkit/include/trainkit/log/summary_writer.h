#pragma once
/// @file
/// TensorBoard event files (`events.out.tfevents.*`) written without TensorFlow or protobuf: the
/// `Event` messages are encoded by hand and framed as TFRecords, like PyTorch's
/// `torch.utils.tensorboard.SummaryWriter`. Images are PNG-encoded with libpng.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>

namespace at {
class Tensor;
}  // namespace at

namespace trainkit::log {

/// A histogram as TensorBoard's `HistogramProto`: `bucket[i]` counts the values in the bucket whose
/// right edge is `bucket_limit[i]` (the left edge is `bucket_limit[i-1]`).
struct Histogram {
  double min = 0;                    ///< smallest value
  double max = 0;                    ///< largest value
  double num = 0;                    ///< number of values
  double sum = 0;                    ///< sum of the values
  double sum_squares = 0;            ///< sum of their squares
  std::vector<double> bucket_limit;  ///< right edges of the buckets, increasing
  std::vector<double> bucket;        ///< count of values per bucket, as many as bucket_limit
};

/// An 8-bit image: `height` rows top to bottom, each `width` pixels of `channels` interleaved bytes (HWC).
/// `channels` is 1 (gray), 3 (RGB) or 4 (RGBA).
struct Image {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;
  std::vector<uint8_t> pixels;  ///< height · width · channels bytes
};

/// A hyperparameter value of add_hparams: a number, a string or a bool (TensorBoard's three kinds).
class HParamValue {
 public:
  /// Which of the three the value is.
  enum class Kind { kNumber, kString, kBool };
  /// Implicit from a number, a string or a bool, so that `{{"lr", 0.1}, {"optimizer", "sgd"}}` reads naturally;
  /// integers become numbers (doubles), as in TensorBoard.
  HParamValue(double v) : kind_(Kind::kNumber), number_(v) {}            // NOLINT(google-explicit-constructor)
  HParamValue(int v) : HParamValue(static_cast<double>(v)) {}            // NOLINT(google-explicit-constructor)
  HParamValue(int64_t v) : HParamValue(static_cast<double>(v)) {}        // NOLINT(google-explicit-constructor)
  HParamValue(bool v) : kind_(Kind::kBool), bool_(v) {}                  // NOLINT(google-explicit-constructor)
  HParamValue(std::string v) : kind_(Kind::kString), string_(std::move(v)) {}  // NOLINT(google-explicit-constructor)
  HParamValue(const char* v) : HParamValue(std::string(v)) {}            // NOLINT(google-explicit-constructor)
  /// The kind; only the matching accessor below is meaningful.
  Kind kind() const { return kind_; }
  /// The number (kNumber).
  double number() const { return number_; }
  /// The string (kString).
  const std::string& string() const { return string_; }
  /// The bool (kBool).
  bool boolean() const { return bool_; }

 private:
  Kind kind_;
  double number_ = 0;
  std::string string_;
  bool bool_ = false;
};

/// Options of SummaryWriter, named as PyTorch's `SummaryWriter` arguments:
/// `SummaryWriterOptions().flush_secs(10).filename_suffix(".rank0")`.
struct SummaryWriterOptions {
  /// How often, in seconds, written events are flushed to disk (checked when an event is added; >= 0).
  TORCH_ARG(double, flush_secs) = 120;
  /// Appended to every event file's name.
  TORCH_ARG(std::string, filename_suffix);
  /// A disabled writer creates no directory or file and ignores every call (e.g. on ranks other than 0).
  TORCH_ARG(bool, enabled) = true;
};

/// Writes TensorBoard event files into `log_dir`: scalars, text, histograms, images and hparams, readable by
/// TensorBoard and by `scripts/read_tfevents.py`. Not copyable; safe to call from several threads.
///
/// File: `log_dir/events.out.tfevents.<unix seconds>.<hostname>.<pid>.<counter><filename_suffix>`,
/// first record `Event{wall_time, file_version: "brain.Event:2"}`. Each record is a TFRecord:
/// uint64 length, masked CRC-32C of it, the serialized Event, masked CRC-32C of the Event
/// (all little-endian). Errors creating or writing files throw std::runtime_error naming the path.
class SummaryWriter {
 public:
  /// Creates `log_dir` (with parents) and the event file, and writes and flushes the version record.
  explicit SummaryWriter(std::string log_dir, SummaryWriterOptions options = {});
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;
  SummaryWriter(SummaryWriter&&) noexcept;
  SummaryWriter& operator=(SummaryWriter&&) noexcept;

  /// One scalar (stored as a float `simple_value`); `wall_time` in seconds since the epoch, now if empty.
  void add_scalar(const std::string& tag, double value, int64_t step, std::optional<double> wall_time = {});
  /// Several scalars in one chart: as PyTorch, each `name` goes to its own event file in
  /// `log_dir/<main_tag with '/' as '_'>_<name>/`, under the tag `main_tag`.
  void add_scalars(const std::string& main_tag, const std::map<std::string, double>& scalars, int64_t step,
                   std::optional<double> wall_time = {});
  /// Text (Markdown in TensorBoard) under the tag `tag + "/text_summary"`, as PyTorch's `add_text`.
  void add_text(const std::string& tag, const std::string& text, int64_t step,
                std::optional<double> wall_time = {});
  /// A histogram of `values`, binned as PyTorch's `make_histogram` (numpy.histogram, then trimmed to the
  /// buckets holding values plus one empty bucket on the left that carries the leftmost edge).
  /// `bins` empty: PyTorch's default "tensorflow" edges, 0 and ±1e-12·1.1^k up to 1e20; `bins` = n: n
  /// equal-width buckets between min and max (min ± 0.5 when all values are equal).
  /// Throws std::invalid_argument for no values, a non-finite value or `bins` < 1.
  void add_histogram(const std::string& tag, const std::vector<double>& values, int64_t step,
                     std::optional<int64_t> bins = std::nullopt, std::optional<double> wall_time = {});
  /// The same for `n` floats at `values` (e.g. `tensor.data_ptr<float>()` of a contiguous CPU tensor).
  void add_histogram(const std::string& tag, const float* values, size_t n, int64_t step,
                     std::optional<int64_t> bins = std::nullopt, std::optional<double> wall_time = {});
  /// A histogram already binned.
  void add_histogram_raw(const std::string& tag, const Histogram& histogram, int64_t step,
                         std::optional<double> wall_time = {});

  /// An image (PNG, Summary.Image with height, width, colorspace) from a tensor (any device) laid out as
  /// `dataformats`, converted as PyTorch's `add_image` (`convert_to_HWC`, `_calc_scale_factor`):
  /// `dataformats` is an ordering of "HW", "CHW" or "NCHW" ("HWC", "NHWC" ...); N images (1 or 3 channels)
  /// are tiled into a grid of at most 8 columns (`make_grid`, zero background); one channel is repeated to
  /// RGB. uint8 values are kept; any other dtype is multiplied by 255, clipped to [0, 255] and truncated
  /// toward zero (NaN becomes 0). Throws std::invalid_argument naming the shape, `dataformats` or the
  /// channel count when they do not fit.
  void add_image(const std::string& tag, const at::Tensor& image, int64_t step, const std::string& dataformats = "CHW",
                 std::optional<double> wall_time = {});
  /// An image already in 8-bit HWC form (std::invalid_argument for a bad shape).
  void add_image(const std::string& tag, const Image& image, int64_t step, std::optional<double> wall_time = {});
  /// Hyperparameters and their final metrics for TensorBoard's HPARAMS tab, as PyTorch's `add_hparams`:
  /// a run `log_dir/<run_name>` (default: the current Unix time with fractional seconds, as PyTorch) gets
  /// the hparams plugin's experiment, session_start_info and session_end_info summaries at `step`, then
  /// one scalar per metric under its own tag. Returns that run's directory ("" if disabled). Unlike
  /// PyTorch, which writes a bool as the number 1.0 or 0.0, a bool stays a bool (true/false in TensorBoard).
  /// Throws std::invalid_argument for an empty or repeated name.
  std::string add_hparams(const std::vector<std::pair<std::string, HParamValue>>& hparams,
                          const std::vector<std::pair<std::string, double>>& metrics, const std::string& run_name = "",
                          int64_t step = 0);

  /// Writes buffered events of every event file to disk.
  void flush();
  /// Flushes and closes every event file; later calls are ignored. Idempotent; the destructor calls it.
  void close();

  /// The log directory.
  const std::string& log_dir() const;
  /// Path of the main event file; empty when disabled.
  std::string file_path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainkit::log
