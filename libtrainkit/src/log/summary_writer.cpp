#include "trainkit/log/summary_writer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>

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
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2, kValueHisto = 5, kValueTensor = 8, kValueMetadata = 9;
constexpr uint32_t kHistoMin = 1, kHistoMax = 2, kHistoNum = 3, kHistoSum = 4, kHistoSumSquares = 5,
                   kHistoBucketLimit = 6, kHistoBucket = 7;
constexpr uint32_t kMetadataPluginData = 1, kPluginName = 1;
constexpr uint32_t kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8;
constexpr uint32_t kShapeDim = 2, kDimSize = 1;
}  // namespace field
constexpr uint64_t kDtString = 7;  // tensorboard.DataType.DT_STRING

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

/// An Event holding a Summary with one Value (`value_body` is the Value without its tag).
std::string encode_summary_event(double wall_time, int64_t step, const std::string& tag,
                                 const std::string& value_body) {
  std::string value;
  put_bytes_field(value, field::kValueTag, tag);
  value += value_body;
  std::string summary;
  put_bytes_field(summary, field::kSummaryValue, value);
  std::string event;
  put_double_field(event, field::kEventWallTime, wall_time);
  if (step != 0) {  // proto3 leaves out zero scalars
    put_varint_field(event, field::kEventStep, static_cast<uint64_t>(step));
  }
  put_bytes_field(event, field::kEventSummary, summary);
  return event;
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
  std::string plugin_data;
  put_bytes_field(plugin_data, field::kPluginName, "text");
  std::string metadata;
  put_bytes_field(metadata, field::kMetadataPluginData, plugin_data);
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
