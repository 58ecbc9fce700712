#pragma once
// Helpers shared by trainkit's tests.

#define TOML_HEADER_ONLY 1
#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

/// Ends the current test case as skipped, with a reason. Catch2 2.13 has no skip of its own: the warning
/// is printed, and ctest reports the test "Skipped" (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt), so
/// the count of checks that really ran stays honest. Use it only at the test case's top level, and only in
/// a case tagged [may-skip] or [cuda] (or a hidden one with its own ctest entry): those cases run as one
/// ctest entry each, never inside their file's entry, where the skip would be reported as a pass
/// (scripts/check_test_quality.py fails on a TRAINKIT_SKIP in any other case).
#define TRAINKIT_SKIP(reason)                  \
  do {                                         \
    WARN("trainkit-skip: " << reason);         \
    return;                                    \
  } while (false)

namespace trainkit::test {

/// Collects what spdlog's default logger writes while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::string text() const {
    sink_->flush();
    return text_.str();
  }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

/// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("trainkit-test-" + tag + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str(const std::string& child = "") const { return (path_ / child).string(); }

 private:
  std::filesystem::path path_;
};

/// Whether process `pid` still runs: it exists and is no zombie (a dead process that the container's init
/// has not reaped yet holds no port, GPU or file any more). For processes that are not the test's children,
/// which it could waitpid.
inline bool process_runs(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const auto paren = text.rfind(')');  // the state follows the command name, which may hold spaces
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

/// Path of a file in the source tree.
inline std::string source_path(const std::string& rel) { return std::string(TRAINKIT_SOURCE_DIR) + "/" + rel; }

/// The TensorBoard event files (names containing "tfevents") directly in `dir`.
inline std::vector<std::filesystem::path> event_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().filename().string().find("tfevents") != std::string::npos) {
      files.push_back(entry.path());
    }
  }
  return files;
}

/// A golden TOML file from tests/golden/, parsed once per process: a test case with sections re-runs its
/// body once per section, and optim.toml (250 KB) took longer to parse than most sections take to run.
inline const toml::table& golden(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, toml::table> parsed;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = parsed.find(name);
  if (it == parsed.end()) {
    it = parsed.emplace(name, toml::parse_file(source_path("tests/golden/" + name))).first;
  }
  return it->second;
}

/// The values of a TOML array (of numbers or strings) as `T`s.
template <class T>
std::vector<T> values_of(const toml::node& node) {
  std::vector<T> out;
  for (const auto& v : *node.as_array()) {
    out.push_back(v.value<T>().value());
  }
  return out;
}

/// Matches an exception whose what() contains `text` (Catch2 v2's Contains matches strings only).
class WhatContains : public Catch::MatcherBase<std::exception> {
 public:
  explicit WhatContains(std::string text) : text_(std::move(text)) {}
  bool match(const std::exception& e) const override { return std::string(e.what()).find(text_) != std::string::npos; }
  std::string describe() const override { return "what() contains \"" + text_ + "\""; }

 private:
  std::string text_;
};

/// The whole file at `path`, byte for byte ("" when it cannot be read).
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// How many times `what` occurs in `text` (non-overlapping).
inline int64_t count_occurrences(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) {
    ++n;
  }
  return n;
}

/// The directory with Debian's Fashion-MNIST files (installed by scripts/setup.sh).
inline std::string fashion_mnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

}  // namespace trainkit::test
