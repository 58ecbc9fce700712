#pragma once
/// @file
/// The one entry wrapper of trainkit's CLI and apps: errors become a message and an exit code.

#include <functional>
#include <string>

namespace trainkit::app {

/// Exit code for usage and configuration errors (bad flag, unknown key, out-of-range value).
constexpr int kExitUsage = 2;
/// Exit code for runtime and data errors (missing or corrupt file, failed rank, LibTorch error).
constexpr int kExitFailure = 1;

/// Runs `body` and returns its exit code; an exception becomes one logged line and an exit code:
/// ConfigError, UsageError and other std::invalid_argument → kExitUsage; data, checkpoint, LibTorch and
/// other errors → kExitFailure. LibTorch's C++ backtrace is shown only at log level debug or lower.
/// SIGXFSZ is ignored from here on, so a file-size limit fails a write with an error naming the file.
int run_main(const std::function<int()>& body);

/// Sets spdlog's console pattern and level ("trace", "debug", "info", "warn", "error", "off").
void set_log_level(const std::string& level);

}  // namespace trainkit::app
