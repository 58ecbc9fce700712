#include "trainkit/log/summary_writer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>

#include "log/detail/hparams.h"
#include "log/detail/histogram.h"
#include "log/detail/image.h"
#include "log/detail/png.h"
#include "log/detail/tensorboard_proto.h"
#include "log/detail/tfrecord.h"

namespace trainkit::log {
namespace {

namespace fs = std::filesystem;

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

/// One event file: its unique name, TFRecord-framed events and time-based flushing.
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
    write(detail::file_version_event(now));
    flush();
  }

  void write(const std::string& event) {
    const std::string record = detail::frame_tfrecord(event);
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

}  // namespace

struct SummaryWriter::Impl {
  std::string log_dir;
  SummaryWriterOptions options;
  std::mutex mutex;
  std::unique_ptr<EventFile> main;
  std::map<std::string, std::unique_ptr<EventFile>> scalars_files;  // add_scalars' sub-directories
  bool closed = false;

  void add(EventFile& file, double wall_time, int64_t step, const std::string& tag, const std::string& body) {
    file.write(detail::encode_event(wall_time, step, detail::encode_summary(tag, body)));
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
  const std::string body = detail::scalar_value(static_cast<float>(value));
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
    impl_->add(*file, wt, step, main_tag, detail::scalar_value(static_cast<float>(value)));
  }
}

void SummaryWriter::add_text(const std::string& tag, const std::string& text, int64_t step,
                             std::optional<double> wall_time) {
  if (!impl_ || !impl_->main) {
    return;
  }
  const std::string body = detail::text_value(text);
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
  add_histogram_raw(tag, detail::make_histogram(values, bins), step, wall_time);
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
  const std::string body = detail::histogram_value(histogram);
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
  add_image(tag, detail::make_image(image, dataformats), step, wall_time);
}

void SummaryWriter::add_image(const std::string& tag, const Image& image, int64_t step,
                              std::optional<double> wall_time) {
  if (!impl_ || !impl_->main) {
    return;
  }
  const std::string body = detail::image_value(image, detail::encode_png(image));
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
  const detail::HParamsSummaries summaries = detail::make_hparams_summaries(hparams, metrics);
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
    run.impl_->main->write(detail::encode_event(now, step, *s));
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
