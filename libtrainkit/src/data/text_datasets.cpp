#include "trainkit/data/text_datasets.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "trainkit/data/idx.h"

namespace trainkit::data {
namespace fs = std::filesystem;
namespace {

/// The whole file; DataError naming it when it is not a readable regular file.
std::string read_text_file(const fs::path& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    throw DataError(fmt::format("{}: cannot open: no such file (or a dangling link)", path.string()));
  }
  if (!fs::is_regular_file(status)) {
    throw DataError(fmt::format("{}: cannot read: not a regular file", path.string()));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw DataError(fmt::format("{}: cannot open (permission denied?)", path.string()));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw DataError(fmt::format("{}: read failed", path.string()));
  }
  return text.str();
}

void require_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw DataError(fmt::format("{}: no such directory", dir.string()));
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Reads the reviews of one aclImdb folder, in file-name order, with label `label`.
void read_review_folder(const fs::path& folder, int64_t label, TextSet& set) {
  require_directory(folder);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (entry.path().extension() == ".txt") {
      files.push_back(entry.path());
    }
  }
  if (files.empty()) {
    throw DataError(fmt::format("{}: no .txt files (expected one review per file)", folder.string()));
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    set.texts.push_back(read_text_file(file));
    set.labels.push_back(label);
  }
}

}  // namespace

std::vector<int64_t> TextSet::class_counts() const {
  std::vector<int64_t> counts(classes.size(), 0);
  for (const auto label : labels) {
    ++counts.at(static_cast<size_t>(label));
  }
  return counts;
}

std::vector<std::string> read_fortune_file(const std::string& path) {
  const std::string text = read_text_file(path);
  std::vector<std::string> records;
  std::string record;
  const auto flush = [&] {
    while (!record.empty() && (record.back() == '\n' || record.back() == '\r')) {
      record.pop_back();
    }
    if (record.find_first_not_of(" \t\r\n") != std::string::npos) {
      records.push_back(record);
    }
    record.clear();
  };
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line == "%" || line == "%\r") {
      flush();
    } else {
      record += line;
      record += '\n';
    }
  }
  flush();
  return records;
}

TextSet read_fortunes(const std::string& dir, const FortunesOptions& options) {
  require_directory(dir);
  std::vector<std::string> names = options.classes();
  if (names.empty()) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_regular_file() || entry.is_symlink() || name.empty() || name[0] == '.' ||
          ends_with(name, ".dat") || ends_with(name, ".u8")) {
        continue;
      }
      names.push_back(name);
    }
    std::sort(names.begin(), names.end());
  }
  TextSet set;
  for (const auto& name : names) {
    const auto path = (fs::path(dir) / name).string();
    auto records = read_fortune_file(path);
    if (static_cast<int64_t>(records.size()) < options.min_records()) {
      if (!options.classes().empty()) {
        throw DataError(fmt::format("{}: {} records, fewer than min_records = {}", path, records.size(),
                                    options.min_records()));
      }
      continue;
    }
    const auto label = static_cast<int64_t>(set.classes.size());
    set.classes.push_back(name);
    for (auto& record : records) {
      set.texts.push_back(std::move(record));
      set.labels.push_back(label);
    }
  }
  if (set.classes.empty()) {
    throw DataError(fmt::format("{}: no fortune files with at least {} records", dir, options.min_records()));
  }
  return set;
}

TextSplit stratified_split(const TextSet& set, double test_fraction, uint64_t seed) {
  if (!(test_fraction > 0.0 && test_fraction < 1.0)) {
    throw std::invalid_argument(fmt::format("stratified_split: test_fraction must be in (0, 1), got {}", test_fraction));
  }
  std::vector<std::vector<size_t>> members(set.classes.size());
  for (size_t i = 0; i < set.labels.size(); ++i) {
    members.at(static_cast<size_t>(set.labels[i])).push_back(i);
  }
  // Fisher-Yates with mt19937_64's raw output (std::shuffle's use of the engine is not specified, so the
  // split would differ between standard libraries).
  std::mt19937_64 rng(seed);
  std::vector<bool> in_test(set.labels.size(), false);
  for (auto& m : members) {
    for (size_t i = m.size(); i > 1; --i) {
      std::swap(m[i - 1], m[static_cast<size_t>(rng() % i)]);
    }
    auto n_test = static_cast<size_t>(std::llround(static_cast<double>(m.size()) * test_fraction));
    n_test = std::min(n_test, m.empty() ? 0 : m.size() - 1);
    for (size_t k = 0; k < n_test; ++k) {
      in_test[m[k]] = true;
    }
  }
  TextSplit split;
  split.train.classes = set.classes;
  split.test.classes = set.classes;
  for (size_t i = 0; i < set.texts.size(); ++i) {
    TextSet& to = in_test[i] ? split.test : split.train;
    to.texts.push_back(set.texts[i]);
    to.labels.push_back(set.labels[i]);
  }
  return split;
}

TextSplit read_aclimdb(const std::string& dir) {
  require_directory(dir);
  TextSplit split;
  for (auto* part : {&split.train, &split.test}) {
    part->classes = {"neg", "pos"};
    const fs::path base = fs::path(dir) / (part == &split.train ? "train" : "test");
    read_review_folder(base / "neg", 0, *part);
    read_review_folder(base / "pos", 1, *part);
  }
  return split;
}

}  // namespace trainkit::data
