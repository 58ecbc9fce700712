#include "trainkit/log/progress.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

namespace trainkit::log {

bool is_terminal(std::FILE* stream) { return ::isatty(::fileno(stream)) == 1; }

void ProgressBar::update(const std::string& label, int64_t done, int64_t total, const std::string& suffix) {
  const double frac = total > 0 ? std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(frac * width_);
  fmt::print(stderr, "\r{} [{}{}] {}/{} {}\x1b[K", label, std::string(static_cast<size_t>(filled), '#'),
             std::string(static_cast<size_t>(width_ - filled), '.'), done,
             total >= 0 ? std::to_string(total) : std::string("?"), suffix);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (drawn_) {
    fmt::print(stderr, "\n");
    drawn_ = false;
  }
}

}  // namespace trainkit::log
