#pragma once
/// @file
/// Console progress: a redrawn bar on a terminal, or one plain log line per interval otherwise.

#include <cstdint>
#include <cstdio>
#include <string>

namespace trainkit::log {

/// True when `stream` is a terminal (progress bars are drawn only then).
bool is_terminal(std::FILE* stream);

/// Draws `label [#####.....] done/total suffix` on stderr, redrawn in place with '\r'.
class ProgressBar {
 public:
  /// A bar `width` characters wide.
  explicit ProgressBar(int width = 30) : width_(width) {}
  /// Redraws the bar (an empty bar and "done/?" when `total` is negative, i.e. unknown).
  void update(const std::string& label, int64_t done, int64_t total, const std::string& suffix);
  /// Ends the bar's line (the next output starts on a fresh line).
  void finish();

 private:
  int width_;
  bool drawn_ = false;
};

}  // namespace trainkit::log
