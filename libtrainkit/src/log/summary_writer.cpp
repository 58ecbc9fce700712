#include "trainkit/log/summary_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <png.h>
#include <torch/torch.h>

namespace trainkit::log {
namespace {

namespace fs = std::filesystem;

// ---- CRC-32C ----------------------------------------------------------------------------------

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) {
      c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// ---- protobuf wire format ---------------------------------------------------------------------

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Field numbers, checked against tensorboard/compat/proto/{event,summary,histogram,tensor,tensor_shape}.proto.
namespace field {
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2, kValueImage = 4, kValueHisto = 5, kValueTensor = 8,
                   kValueMetadata = 9;
constexpr uint32_t kImageHeight = 1, kImageWidth = 2, kImageColorspace = 3, kImageEncoded = 4;
constexpr uint32_t kHistoMin = 1, kHistoMax = 2, kHistoNum = 3, kHistoSum = 4, kHistoSumSquares = 5,
                   kHistoBucketLimit = 6, kHistoBucket = 7;
constexpr uint32_t kMetadataPluginData = 1, kPluginName = 1, kPluginContent = 2;
constexpr uint32_t kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8;
constexpr uint32_t kShapeDim = 2, kDimSize = 1;
// tensorboard/plugins/hparams/{plugin_data,api}.proto and google/protobuf/struct.proto.
constexpr uint32_t kHpPluginDataExperiment = 2, kHpPluginDataSessionStart = 3, kHpPluginDataSessionEnd = 4;
constexpr uint32_t kSessionStartHparams = 1, kMapKey = 1, kMapValue = 2;
constexpr uint32_t kStructNumber = 2, kStructString = 3, kStructBool = 4;
constexpr uint32_t kExperimentHparamInfos = 4, kExperimentMetricInfos = 5;
constexpr uint32_t kHparamInfoName = 1, kHparamInfoType = 4;
constexpr uint32_t kMetricInfoName = 1, kMetricNameTag = 2;
constexpr uint32_t kSessionEndStatus = 1;
}  // namespace field
constexpr uint64_t kDtString = 7;  // tensorboard.DataType.DT_STRING
// hparams api.proto enums.
constexpr uint64_t kHpTypeString = 1, kHpTypeBool = 2, kHpTypeFloat64 = 3, kHpStatusSuccess = 1;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <class T>
void put_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff));
  }
}

void put_key(std::string& out, uint32_t number, WireType type) { put_varint(out, (uint64_t{number} << 3) | type); }

void put_varint_field(std::string& out, uint32_t number, uint64_t v) {
  put_key(out, number, kVarint);
  put_varint(out, v);
}

void put_double_bits(std::string& out, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_le<uint64_t>(out, bits);
}

void put_double_field(std::string& out, uint32_t number, double v) {
  put_key(out, number, kFixed64);
  put_double_bits(out, v);
}

void put_float_field(std::string& out, uint32_t number, float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, number, kFixed32);
  put_le<uint32_t>(out, bits);
}

void put_bytes_field(std::string& out, uint32_t number, const std::string& bytes) {
  put_key(out, number, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_packed_doubles(std::string& out, uint32_t number, const std::vector<double>& values) {
  std::string packed;
  packed.reserve(values.size() * 8);
  for (double v : values) {
    put_double_bits(packed, v);
  }
  put_bytes_field(out, number, packed);
}

std::string encode_histogram(const Histogram& h) {
  std::string out;
  put_double_field(out, field::kHistoMin, h.min);
  put_double_field(out, field::kHistoMax, h.max);
  put_double_field(out, field::kHistoNum, h.num);
  put_double_field(out, field::kHistoSum, h.sum);
  put_double_field(out, field::kHistoSumSquares, h.sum_squares);
  put_packed_doubles(out, field::kHistoBucketLimit, h.bucket_limit);
  put_packed_doubles(out, field::kHistoBucket, h.bucket);
  return out;
}

/// A Summary with one Value (`value_body` is the Value without its tag).
std::string encode_summary(const std::string& tag, const std::string& value_body) {
  std::string value;
  put_bytes_field(value, field::kValueTag, tag);
  value += value_body;
  std::string summary;
  put_bytes_field(summary, field::kSummaryValue, value);
  return summary;
}

/// An Event holding a serialized Summary.
std::string encode_event(double wall_time, int64_t step, const std::string& summary) {
  std::string event;
  put_double_field(event, field::kEventWallTime, wall_time);
  if (step != 0) {  // proto3 leaves out zero scalars
    put_varint_field(event, field::kEventStep, static_cast<uint64_t>(step));
  }
  put_bytes_field(event, field::kEventSummary, summary);
  return event;
}

/// An Event holding a Summary with one Value (`value_body` is the Value without its tag).
std::string encode_summary_event(double wall_time, int64_t step, const std::string& tag,
                                 const std::string& value_body) {
  return encode_event(wall_time, step, encode_summary(tag, value_body));
}

/// SummaryMetadata{plugin_data{plugin_name, content}} (content left out when empty, as proto3 does).
std::string plugin_metadata(const std::string& plugin_name, const std::string& content) {
  std::string plugin_data;
  put_bytes_field(plugin_data, field::kPluginName, plugin_name);
  if (!content.empty()) {
    put_bytes_field(plugin_data, field::kPluginContent, content);
  }
  std::string metadata;
  put_bytes_field(metadata, field::kMetadataPluginData, plugin_data);
  return metadata;
}

// ---- PNG through libpng ------------------------------------------------------------------------
// libpng reports errors by longjmp; the functions holding setjmp have only trivially destructible
// locals, and every C++ object they touch lives in their caller.

void png_append(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<std::string*>(png_get_io_ptr(png));
  out->append(reinterpret_cast<const char*>(data), n);
}

void png_no_flush(png_structp /*png*/) {}

struct PngSource {
  const std::string* bytes;
  size_t pos;
};

void png_take(png_structp png, png_bytep data, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->bytes->size() - src->pos < n) {
    png_error(png, "unexpected end of data");
  }
  std::memcpy(data, src->bytes->data() + src->pos, n);
  src->pos += n;
}

// Error text of the last libpng failure (per thread, so writers on several threads do not mix them).
thread_local char g_png_error[256];

void png_on_error(png_structp png, png_const_charp message) {
  std::snprintf(g_png_error, sizeof g_png_error, "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp /*png*/, png_const_charp /*message*/) {}

bool png_write_rows(const Image& image, png_bytep* rows, std::string* out) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, png_on_error, png_on_warning);
  if (png == nullptr) {
    std::snprintf(g_png_error, sizeof g_png_error, "png_create_write_struct failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, info != nullptr ? &info : nullptr);
    if (info == nullptr) {
      std::snprintf(g_png_error, sizeof g_png_error, "png_create_info_struct failed");
    }
    return false;
  }
  const int color_type = image.channels == 1   ? PNG_COLOR_TYPE_GRAY
                         : image.channels == 3 ? PNG_COLOR_TYPE_RGB
                                               : PNG_COLOR_TYPE_RGBA;
  png_set_write_fn(png, out, png_append, png_no_flush);
  png_set_IHDR(png, info, static_cast<png_uint_32>(image.width), static_cast<png_uint_32>(image.height), 8,
               color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

/// Reads the header into `image` (no pixels) and, when `rows` is given, the pixels into those rows.
bool png_read(PngSource* src, Image* image, std::vector<png_bytep>* rows) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, png_on_error, png_on_warning);
  if (png == nullptr) {
    std::snprintf(g_png_error, sizeof g_png_error, "png_create_read_struct failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
    if (info == nullptr) {
      std::snprintf(g_png_error, sizeof g_png_error, "png_create_info_struct failed");
    }
    return false;
  }
  png_set_read_fn(png, src, png_take);
  png_read_info(png, info);
  const int depth = png_get_bit_depth(png, info);
  const int color = png_get_color_type(png, info);
  const int channels = color == PNG_COLOR_TYPE_GRAY ? 1 : color == PNG_COLOR_TYPE_RGB ? 3 : color == PNG_COLOR_TYPE_RGBA ? 4 : 0;
  if (depth != 8 || channels == 0 || png_get_interlace_type(png, info) != PNG_INTERLACE_NONE) {
    std::snprintf(g_png_error, sizeof g_png_error,
                  "only 8-bit, non-interlaced gray, RGB or RGBA PNGs are supported (bit depth %d, color type %d)",
                  depth, color);
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  image->height = png_get_image_height(png, info);
  image->width = png_get_image_width(png, info);
  image->channels = channels;
  if (rows != nullptr) {
    png_read_image(png, rows->data());
    png_read_end(png, nullptr);
  }
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

void check_image(const Image& image, const char* who) {
  if (image.height < 1 || image.width < 1 || image.height > 0x7fffffff || image.width > 0x7fffffff) {
    throw std::invalid_argument(fmt::format("{}: invalid image size {}x{}", who, image.height, image.width));
  }
  if (image.channels != 1 && image.channels != 3 && image.channels != 4) {
    throw std::invalid_argument(fmt::format("{}: {} channels (need 1, 3 or 4)", who, image.channels));
  }
  const auto expected = static_cast<size_t>(image.height * image.width * image.channels);
  if (image.pixels.size() != expected) {
    throw std::invalid_argument(fmt::format("{}: {} bytes of pixels for a {}x{}x{} image (need {})", who,
                                            image.pixels.size(), image.height, image.width, image.channels,
                                            expected));
  }
}

/// numpy's transpose by the positions of `target`'s letters in `format` (as convert_to_HWC does).
at::Tensor to_layout(const at::Tensor& t, const std::string& format, const std::string& target) {
  std::vector<int64_t> order;
  for (char c : target) {
    order.push_back(static_cast<int64_t>(format.find(c)));
  }
  return t.permute(order);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) {
    return "localhost";
  }
  return std::string(name.data());
}

// Shared by every writer of the process, as tensorboard's _global_uid, so that two files created in
// the same second never get the same name.
std::atomic<uint64_t> g_file_counter{0};

/// One event file: TFRecord framing and time-based flushing.
class EventFile {
 public:
  EventFile(const std::string& dir, const std::string& suffix, double flush_secs) : flush_secs_(flush_secs) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec || !fs::is_directory(dir)) {
      throw std::runtime_error(
          fmt::format("{}: cannot create the log directory: {}", dir, ec ? ec.message() : "not a directory"));
    }
    const double now = now_seconds();
    path_ = (fs::path(dir) / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}{}", static_cast<int64_t>(now),
                                         hostname(), ::getpid(), g_file_counter.fetch_add(1), suffix))
                .string();
    out_.open(path_, std::ios::binary | std::ios::trunc);
    if (!out_) {
      throw std::runtime_error(fmt::format("{}: cannot open for writing: {}", path_, std::strerror(errno)));
    }
    std::string event;
    put_double_field(event, field::kEventWallTime, now);
    put_bytes_field(event, field::kEventFileVersion, "brain.Event:2");
    write(event);
    flush();
  }

  void write(const std::string& event) {
    std::string header;
    put_le<uint64_t>(header, event.size());
    std::string record = header;
    put_le<uint32_t>(record, masked_crc32c(header.data(), header.size()));
    record += event;
    put_le<uint32_t>(record, masked_crc32c(event.data(), event.size()));
    out_.write(record.data(), static_cast<std::streamsize>(record.size()));
    if (!out_) {
      throw std::runtime_error(fmt::format("{}: write failed (disk full?)", path_));
    }
    if (std::chrono::duration<double>(Clock::now() - last_flush_).count() >= flush_secs_) {
      flush();
    }
  }

  void flush() {
    out_.flush();
    if (!out_) {
      throw std::runtime_error(fmt::format("{}: flush failed (disk full?)", path_));
    }
    last_flush_ = Clock::now();
  }

  void close() {
    if (out_.is_open()) {
      flush();
      out_.close();
    }
  }

  const std::string& path() const { return path_; }

 private:
  using Clock = std::chrono::steady_clock;
  std::string path_;
  std::ofstream out_;
  double flush_secs_;
  Clock::time_point last_flush_ = Clock::now();
};

void check_finite(const std::vector<double>& values) {
  for (double v : values) {
    if (!std::isfinite(v)) {
      throw std::invalid_argument(fmt::format("make_histogram: values must be finite, got {}", v));
    }
  }
}

// PyTorch's SummaryWriter.default_bins ("tensorflow"): -1e20.. -1e-12, 0, 1e-12 .. 1e20 in steps of 1.1x.
const std::vector<double>& default_bin_edges() {
  static const std::vector<double> edges = [] {
    std::vector<double> positive;
    for (double v = 1e-12; v < 1e20; v *= 1.1) {
      positive.push_back(v);
    }
    std::vector<double> all;
    all.reserve(2 * positive.size() + 1);
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) {
      all.push_back(-*it);
    }
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    return all;
  }();
  return edges;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc = kCrc32cTable[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  }
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

Histogram make_histogram(const std::vector<double>& values, std::optional<int64_t> bins) {
  if (values.empty()) {
    throw std::invalid_argument("make_histogram: the input has no element");
  }
  if (bins && *bins < 1) {
    throw std::invalid_argument(fmt::format("make_histogram: bins must be positive, got {}", *bins));
  }
  check_finite(values);
  Histogram h;
  h.min = *std::min_element(values.begin(), values.end());
  h.max = *std::max_element(values.begin(), values.end());
  h.num = static_cast<double>(values.size());
  for (double v : values) {
    h.sum += v;
    h.sum_squares += v * v;
  }

  std::vector<double> edges;
  if (bins) {
    // numpy.histogram(values, bins=n): linspace edges over [min, max], widened by 0.5 if empty.
    double first = h.min;
    double last = h.max;
    if (first == last) {
      first -= 0.5;
      last += 0.5;
    }
    const auto n = static_cast<size_t>(*bins);
    edges.resize(n + 1);
    const double step = (last - first) / static_cast<double>(n);
    for (size_t i = 0; i < n; ++i) {
      edges[i] = first + static_cast<double>(i) * step;
    }
    edges[n] = last;
  } else {
    edges = default_bin_edges();
  }

  // numpy semantics: bucket i holds [edges[i], edges[i+1]), the last one also its right edge;
  // values outside [edges.front(), edges.back()] are dropped.
  const size_t num_buckets = edges.size() - 1;
  std::vector<double> counts(num_buckets, 0.0);
  for (double v : values) {
    if (v < edges.front() || v > edges.back()) {
      continue;
    }
    auto i = static_cast<size_t>(std::upper_bound(edges.begin(), edges.end(), v) - edges.begin());
    counts[std::min(i, num_buckets) - 1] += 1.0;
  }

  // Trim to the support as PyTorch does; bucket_limit keeps right edges only, so an empty bucket is
  // kept on the left to carry the leftmost edge.
  size_t start = num_buckets;
  size_t end = 0;
  for (size_t i = 0; i < num_buckets; ++i) {
    if (counts[i] > 0) {
      start = std::min(start, i);
      end = i + 1;
    }
  }
  if (start == num_buckets) {
    throw std::invalid_argument("make_histogram: no value falls within the bins");
  }
  if (start > 0) {
    h.bucket.assign(counts.begin() + static_cast<std::ptrdiff_t>(start - 1),
                    counts.begin() + static_cast<std::ptrdiff_t>(end));
  } else {
    h.bucket.push_back(0.0);
    h.bucket.insert(h.bucket.end(), counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(end));
  }
  h.bucket_limit.assign(edges.begin() + static_cast<std::ptrdiff_t>(start),
                        edges.begin() + static_cast<std::ptrdiff_t>(end + 1));
  return h;
}

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

std::string encode_png(const Image& image) {
  check_image(image, "encode_png");
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  const auto stride = static_cast<size_t>(image.width * image.channels);
  for (size_t r = 0; r < rows.size(); ++r) {
    // libpng's row pointers are not const, but png_write_image only reads them.
    rows[r] = const_cast<png_bytep>(image.pixels.data() + r * stride);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
  }
  std::string out;
  if (!png_write_rows(image, rows.data(), &out)) {
    throw std::runtime_error(fmt::format("encode_png: libpng failed: {}", g_png_error));
  }
  return out;
}

Image decode_png(const std::string& png) {
  Image image;
  PngSource header{&png, 0};
  if (!png_read(&header, &image, nullptr)) {
    throw std::runtime_error(fmt::format("decode_png: {}", g_png_error));
  }
  image.pixels.resize(static_cast<size_t>(image.height * image.width * image.channels));
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  for (size_t r = 0; r < rows.size(); ++r) {
    rows[r] = image.pixels.data() + r * static_cast<size_t>(image.width * image.channels);
  }
  PngSource body{&png, 0};
  Image again;
  if (!png_read(&body, &again, &rows)) {
    throw std::runtime_error(fmt::format("decode_png: {}", g_png_error));
  }
  return image;
}

HParamsSummaries make_hparams_summaries(const std::vector<std::pair<std::string, HParamValue>>& hparams,
                                        const std::vector<std::pair<std::string, double>>& metrics) {
  const auto check_names = [](const auto& items, const char* what) {
    std::vector<std::string> names;
    for (const auto& item : items) {
      if (item.first.empty()) {
        throw std::invalid_argument(fmt::format("add_hparams: an empty {} name", what));
      }
      names.push_back(item.first);
    }
    std::sort(names.begin(), names.end());
    const auto dup = std::adjacent_find(names.begin(), names.end());
    if (dup != names.end()) {
      throw std::invalid_argument(fmt::format("add_hparams: the {} \"{}\" is given twice", what, *dup));
    }
  };
  check_names(hparams, "hparam");
  check_names(metrics, "metric");

  // HParamsPluginData{version: 0 (left out), <oneof field>: message} as the plugin content.
  const auto summary = [](const std::string& tag, uint32_t oneof_field, const std::string& message) {
    std::string content;
    put_bytes_field(content, oneof_field, message);
    std::string body;
    put_bytes_field(body, field::kValueMetadata, plugin_metadata("hparams", content));
    return encode_summary(tag, body);
  };

  // SessionStartInfo.hparams: map<string, google.protobuf.Value>, entries sorted by key.
  std::vector<std::pair<std::string, HParamValue>> sorted = hparams;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string start;
  for (const auto& [name, value] : sorted) {
    std::string v;
    switch (value.kind()) {
      case HParamValue::Kind::kNumber: put_double_field(v, field::kStructNumber, value.number()); break;
      case HParamValue::Kind::kString: put_bytes_field(v, field::kStructString, value.string()); break;
      case HParamValue::Kind::kBool: put_varint_field(v, field::kStructBool, value.boolean() ? 1 : 0); break;
    }
    std::string entry;
    put_bytes_field(entry, field::kMapKey, name);
    put_bytes_field(entry, field::kMapValue, v);
    put_bytes_field(start, field::kSessionStartHparams, entry);
  }

  std::string experiment;
  for (const auto& [name, value] : hparams) {
    std::string info;
    put_bytes_field(info, field::kHparamInfoName, name);
    const uint64_t type = value.kind() == HParamValue::Kind::kNumber   ? kHpTypeFloat64
                          : value.kind() == HParamValue::Kind::kString ? kHpTypeString
                                                                       : kHpTypeBool;
    put_varint_field(info, field::kHparamInfoType, type);
    put_bytes_field(experiment, field::kExperimentHparamInfos, info);
  }
  for (const auto& [name, value] : metrics) {
    std::string metric_name;
    put_bytes_field(metric_name, field::kMetricNameTag, name);
    std::string info;
    put_bytes_field(info, field::kMetricInfoName, metric_name);
    put_bytes_field(experiment, field::kExperimentMetricInfos, info);
  }

  std::string end;
  put_varint_field(end, field::kSessionEndStatus, kHpStatusSuccess);

  HParamsSummaries out;
  out.experiment = summary("_hparams_/experiment", field::kHpPluginDataExperiment, experiment);
  out.session_start_info = summary("_hparams_/session_start_info", field::kHpPluginDataSessionStart, start);
  out.session_end_info = summary("_hparams_/session_end_info", field::kHpPluginDataSessionEnd, end);
  return out;
}

struct SummaryWriter::Impl {
  std::string log_dir;
  SummaryWriterOptions options;
  std::mutex mutex;
  std::unique_ptr<EventFile> main;
  std::map<std::string, std::unique_ptr<EventFile>> scalars_files;  // add_scalars' sub-directories
  bool closed = false;

  void add(EventFile& file, double wall_time, int64_t step, const std::string& tag, const std::string& body) {
    file.write(encode_summary_event(wall_time, step, tag, body));
  }
};

SummaryWriter::SummaryWriter(std::string log_dir, SummaryWriterOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->log_dir = std::move(log_dir);
  impl_->options = std::move(options);
  if (!(impl_->options.flush_secs() >= 0)) {
    throw std::invalid_argument(fmt::format("SummaryWriter: invalid flush_secs: {}", impl_->options.flush_secs()));
  }
  if (impl_->options.enabled()) {
    impl_->main = std::make_unique<EventFile>(impl_->log_dir, impl_->options.filename_suffix(),
                                              impl_->options.flush_secs());
  }
}

SummaryWriter::~SummaryWriter() {
  try {
    close();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; call close() to see errors
  }
}

SummaryWriter::SummaryWriter(SummaryWriter&&) noexcept = default;
SummaryWriter& SummaryWriter::operator=(SummaryWriter&& other) noexcept {
  if (this != &other) {
    try {
      close();
    } catch (...) {  // NOLINT(bugprone-empty-catch): noexcept, as the destructor
    }
    impl_ = std::move(other.impl_);
  }
  return *this;
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step, std::optional<double> wall_time) {
  if (!impl_ || !impl_->main) {
    return;
  }
  std::string body;
  put_float_field(body, field::kValueSimpleValue, static_cast<float>(value));
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->closed) {
    impl_->add(*impl_->main, wall_time.value_or(now_seconds()), step, tag, body);
  }
}

void SummaryWriter::add_scalars(const std::string& main_tag, const std::map<std::string, double>& scalars,
                                int64_t step, std::optional<double> wall_time) {
  if (!impl_ || !impl_->main) {
    return;
  }
  const double wt = wall_time.value_or(now_seconds());
  std::string dir_tag = main_tag;
  std::replace(dir_tag.begin(), dir_tag.end(), '/', '_');
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->closed) {
    return;
  }
  for (const auto& [name, value] : scalars) {
    const std::string dir = (fs::path(impl_->log_dir) / (dir_tag + "_" + name)).string();
    auto& file = impl_->scalars_files[dir];
    if (!file) {
      file = std::make_unique<EventFile>(dir, impl_->options.filename_suffix(), impl_->options.flush_secs());
    }
    std::string body;
    put_float_field(body, field::kValueSimpleValue, static_cast<float>(value));
    impl_->add(*file, wt, step, main_tag, body);
  }
}

void SummaryWriter::add_text(const std::string& tag, const std::string& text, int64_t step,
                             std::optional<double> wall_time) {
  if (!impl_ || !impl_->main) {
    return;
  }
  // SummaryMetadata{plugin_data{plugin_name: "text"}}; TextPluginData{version: 0} serializes to nothing.
  const std::string metadata = plugin_metadata("text", "");
  // TensorProto{dtype: DT_STRING, tensor_shape{dim{size: 1}}, string_val: [text]}.
  std::string dim;
  put_varint_field(dim, field::kDimSize, 1);
  std::string shape;
  put_bytes_field(shape, field::kShapeDim, dim);
  std::string tensor;
  put_varint_field(tensor, field::kTensorDtype, kDtString);
  put_bytes_field(tensor, field::kTensorShape, shape);
  put_bytes_field(tensor, field::kTensorStringVal, text);

  std::string body;
  put_bytes_field(body, field::kValueTensor, tensor);
  put_bytes_field(body, field::kValueMetadata, metadata);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->closed) {
    impl_->add(*impl_->main, wall_time.value_or(now_seconds()), step, tag + "/text_summary", body);
  }
}

void SummaryWriter::add_histogram(const std::string& tag, const std::vector<double>& values, int64_t step,
                                  std::optional<int64_t> bins, std::optional<double> wall_time) {
  if (!impl_ || !impl_->main) {
    return;
  }
  add_histogram_raw(tag, make_histogram(values, bins), step, wall_time);
}

void SummaryWriter::add_histogram(const std::string& tag, const float* values, size_t n, int64_t step,
                                  std::optional<int64_t> bins, std::optional<double> wall_time) {
  if (!impl_ || !impl_->main) {
    return;
  }
  add_histogram(tag, std::vector<double>(values, values + n), step, bins, wall_time);
}

void SummaryWriter::add_histogram_raw(const std::string& tag, const Histogram& histogram, int64_t step,
                                      std::optional<double> wall_time) {
  if (!impl_ || !impl_->main) {
    return;
  }
  if (histogram.bucket.size() != histogram.bucket_limit.size()) {
    throw std::invalid_argument(fmt::format("add_histogram_raw: {} buckets but {} bucket limits",
                                            histogram.bucket.size(), histogram.bucket_limit.size()));
  }
  std::string body;
  put_bytes_field(body, field::kValueHisto, encode_histogram(histogram));
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->closed) {
    impl_->add(*impl_->main, wall_time.value_or(now_seconds()), step, tag, body);
  }
}

void SummaryWriter::add_image(const std::string& tag, const at::Tensor& image, int64_t step,
                              const std::string& dataformats, std::optional<double> wall_time) {
  if (!impl_ || !impl_->main) {
    return;
  }
  add_image(tag, make_image(image, dataformats), step, wall_time);
}

void SummaryWriter::add_image(const std::string& tag, const Image& image, int64_t step,
                              std::optional<double> wall_time) {
  if (!impl_ || !impl_->main) {
    return;
  }
  std::string encoded;
  put_varint_field(encoded, field::kImageHeight, static_cast<uint64_t>(image.height));
  put_varint_field(encoded, field::kImageWidth, static_cast<uint64_t>(image.width));
  put_varint_field(encoded, field::kImageColorspace, static_cast<uint64_t>(image.channels));
  put_bytes_field(encoded, field::kImageEncoded, encode_png(image));
  std::string body;
  put_bytes_field(body, field::kValueImage, encoded);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->closed) {
    impl_->add(*impl_->main, wall_time.value_or(now_seconds()), step, tag, body);
  }
}

std::string SummaryWriter::add_hparams(const std::vector<std::pair<std::string, HParamValue>>& hparams,
                                       const std::vector<std::pair<std::string, double>>& metrics,
                                       const std::string& run_name, int64_t step) {
  if (!impl_ || !impl_->main) {
    return "";
  }
  const HParamsSummaries summaries = make_hparams_summaries(hparams, metrics);
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->closed) {
      return "";
    }
  }
  const double now = now_seconds();
  // PyTorch names the run str(time.time()); fmt's shortest round-trip form matches Python's repr.
  const std::string dir = (fs::path(impl_->log_dir) / (run_name.empty() ? fmt::format("{}", now) : run_name)).string();
  SummaryWriter run(dir, impl_->options);
  for (const std::string* s : {&summaries.experiment, &summaries.session_start_info, &summaries.session_end_info}) {
    run.impl_->main->write(encode_event(now, step, *s));
  }
  for (const auto& [name, value] : metrics) {
    run.add_scalar(name, value, step, now);
  }
  run.close();
  return dir;
}

void SummaryWriter::flush() {
  if (!impl_ || !impl_->main) {
    return;
  }
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->closed) {
    return;
  }
  impl_->main->flush();
  for (auto& [dir, file] : impl_->scalars_files) {
    file->flush();
  }
}

void SummaryWriter::close() {
  if (!impl_ || !impl_->main) {
    return;
  }
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->closed) {
    return;
  }
  impl_->closed = true;
  impl_->main->close();
  for (auto& [dir, file] : impl_->scalars_files) {
    file->close();
  }
}

const std::string& SummaryWriter::log_dir() const {
  static const std::string empty;
  return impl_ ? impl_->log_dir : empty;
}

std::string SummaryWriter::file_path() const { return impl_ && impl_->main ? impl_->main->path() : std::string(); }

}  // namespace trainkit::log
