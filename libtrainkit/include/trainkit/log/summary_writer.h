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

namespace at {
class Tensor;
}  // namespace at

namespace trainkit::log {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF).
/// `crc32c("123456789") == 0xE3069283`.
uint32_t crc32c(const void* data, size_t n);

/// The TFRecord mask of a CRC-32C: `((crc >> 15) | (crc << 17)) + 0xA282EAD8` modulo 2^32.
uint32_t masked_crc32c(const void* data, size_t n);

/// A histogram as TensorBoard's `HistogramProto`: `bucket[i]` counts the values in the bucket whose
/// right edge is `bucket_limit[i]` (the left edge is `bucket_limit[i-1]`).
struct Histogram {
  double min = 0;
  double max = 0;
  double num = 0;
  double sum = 0;
  double sum_squares = 0;
  std::vector<double> bucket_limit;
  std::vector<double> bucket;
};

/// Bins `values` as PyTorch's `make_histogram` does (numpy.histogram, then trimmed to the buckets
/// holding values plus one empty bucket on the left so the leftmost edge is kept).
/// `bins` empty: PyTorch's default "tensorflow" edges, 0 and ±1e-12·1.1^k up to 1e20.
/// `bins` = n: n equal-width buckets between min and max (min ± 0.5 when all values are equal).
/// Throws std::invalid_argument for no values, a non-finite value or `bins` < 1.
Histogram make_histogram(const std::vector<double>& values, std::optional<int64_t> bins = std::nullopt);

/// An 8-bit image: `height` rows top to bottom, each `width` pixels of `channels` interleaved bytes (HWC).
/// `channels` is 1 (gray), 3 (RGB) or 4 (RGBA).
struct Image {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;
  std::vector<uint8_t> pixels;  ///< height · width · channels bytes
};

/// Converts a tensor (any device) to an Image as PyTorch's `add_image` does (`convert_to_HWC`, then
/// `_calc_scale_factor`): `dataformats` names the dimensions, an ordering of "HW", "CHW" or "NCHW"
/// ("HWC", "NHWC" ...); N images (1 or 3 channels) are tiled into a grid of at most 8 columns
/// (`make_grid`, zero background); one channel is repeated to RGB. uint8 values are kept; any other dtype is multiplied by 255, clipped to
/// [0, 255] and truncated toward zero (NaN becomes 0). Throws std::invalid_argument naming the shape,
/// `dataformats` or the channel count when they do not fit.
Image make_image(const at::Tensor& tensor, const std::string& dataformats = "CHW");

/// PNG bytes of `image` (8-bit gray, RGB or RGBA, no interlacing). Throws std::invalid_argument for a
/// bad shape and std::runtime_error if libpng fails.
std::string encode_png(const Image& image);
/// Decodes 8-bit gray, RGB or RGBA PNG bytes (the inverse of encode_png). Throws std::runtime_error
/// for anything else.
Image decode_png(const std::string& png);

/// A hyperparameter value of add_hparams: a number, a string or a bool (TensorBoard's three kinds).
class HParamValue {
 public:
  enum class Kind { kNumber, kString, kBool };
  HParamValue(double v) : kind_(Kind::kNumber), number_(v) {}            // NOLINT(google-explicit-constructor)
  HParamValue(int v) : HParamValue(static_cast<double>(v)) {}            // NOLINT(google-explicit-constructor)
  HParamValue(int64_t v) : HParamValue(static_cast<double>(v)) {}        // NOLINT(google-explicit-constructor)
  HParamValue(bool v) : kind_(Kind::kBool), bool_(v) {}                  // NOLINT(google-explicit-constructor)
  HParamValue(std::string v) : kind_(Kind::kString), string_(std::move(v)) {}  // NOLINT(google-explicit-constructor)
  HParamValue(const char* v) : HParamValue(std::string(v)) {}            // NOLINT(google-explicit-constructor)
  Kind kind() const { return kind_; }
  double number() const { return number_; }
  const std::string& string() const { return string_; }
  bool boolean() const { return bool_; }

 private:
  Kind kind_;
  double number_ = 0;
  std::string string_;
  bool bool_ = false;
};

/// The three hparams-plugin summaries as torch.utils.tensorboard.summary.hparams builds them, each a
/// serialized `Summary` (one Value: tag `_hparams_/experiment`, `_hparams_/session_start_info` or
/// `_hparams_/session_end_info`, metadata plugin "hparams" with a serialized HParamsPluginData).
/// Experiment lists every hparam (type FLOAT64, STRING or BOOL) and every metric tag in the given
/// order; SessionStartInfo's map is written sorted by key (protobuf's deterministic order);
/// SessionEndInfo has status SUCCESS. Unlike PyTorch, whose `isinstance(v, int)` also catches bools, a
/// bool is written as a bool (bool_value, DATA_TYPE_BOOL), which TensorBoard shows as true/false.
/// Throws std::invalid_argument for an empty or repeated name.
struct HParamsSummaries {
  std::string experiment;
  std::string session_start_info;
  std::string session_end_info;
};
HParamsSummaries make_hparams_summaries(const std::vector<std::pair<std::string, HParamValue>>& hparams,
                                        const std::vector<std::pair<std::string, double>>& metrics);

/// Options of SummaryWriter, named as PyTorch's `SummaryWriter` arguments.
struct SummaryWriterOptions {
  /// How often, in seconds, written events are flushed to disk (checked when an event is added).
  SummaryWriterOptions& flush_secs(double v) {
    flush_secs_ = v;
    return *this;
  }
  double flush_secs() const { return flush_secs_; }
  /// Appended to every event file's name.
  SummaryWriterOptions& filename_suffix(std::string v) {
    filename_suffix_ = std::move(v);
    return *this;
  }
  const std::string& filename_suffix() const { return filename_suffix_; }
  /// A disabled writer creates no directory or file and ignores every call (e.g. on ranks other than 0).
  SummaryWriterOptions& enabled(bool v) {
    enabled_ = v;
    return *this;
  }
  bool enabled() const { return enabled_; }

 private:
  double flush_secs_ = 120;
  std::string filename_suffix_;
  bool enabled_ = true;
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
  /// A histogram of `values` binned by make_histogram (PyTorch's default bins when `bins` is empty).
  void add_histogram(const std::string& tag, const std::vector<double>& values, int64_t step,
                     std::optional<int64_t> bins = std::nullopt, std::optional<double> wall_time = {});
  /// The same for `n` floats at `values` (e.g. `tensor.data_ptr<float>()` of a contiguous CPU tensor).
  void add_histogram(const std::string& tag, const float* values, size_t n, int64_t step,
                     std::optional<int64_t> bins = std::nullopt, std::optional<double> wall_time = {});
  /// A histogram already binned.
  void add_histogram_raw(const std::string& tag, const Histogram& histogram, int64_t step,
                         std::optional<double> wall_time = {});

  /// An image (PNG, Summary.Image with height, width, colorspace) from a tensor laid out as `dataformats`
  /// (PyTorch's `add_image`; see make_image for the conversion).
  void add_image(const std::string& tag, const at::Tensor& image, int64_t step, const std::string& dataformats = "CHW",
                 std::optional<double> wall_time = {});
  /// An image already in 8-bit HWC form.
  void add_image(const std::string& tag, const Image& image, int64_t step, std::optional<double> wall_time = {});
  /// Hyperparameters and their final metrics for TensorBoard's HPARAMS tab, as PyTorch's `add_hparams`:
  /// a run `log_dir/<run_name>` (default: the current Unix time with fractional seconds, as PyTorch) gets
  /// the experiment, session_start_info and session_end_info summaries (make_hparams_summaries) at
  /// `step`, then one scalar per metric under its own tag. Returns that run's directory ("" if disabled).
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
