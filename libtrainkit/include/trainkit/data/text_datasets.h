#pragma once
/// @file
/// Labelled text data sets read from plain files: Debian's `fortunes` package (one class per fortune
/// file) and the aclImdb layout of the Large Movie Review Dataset (Maas et al. 2011), plus a seeded
/// stratified split.
///
///   auto all = data::read_fortunes("/usr/share/games/fortunes");
///   auto [train, test] = data::stratified_split(all, 0.2, /*seed=*/0);
///   auto imdb = data::read_aclimdb("aclImdb");  // imdb.train, imdb.test; classes {"neg", "pos"}

#include <cstdint>
#include <string>
#include <vector>

#include <torch/arg.h>

namespace trainkit::data {

/// Texts, one label each (an index into `classes`).
struct TextSet {
  std::vector<std::string> texts;
  std::vector<int64_t> labels;    ///< parallel to texts, each in [0, classes.size())
  std::vector<std::string> classes;
  /// Number of texts.
  int64_t size() const { return static_cast<int64_t>(texts.size()); }
  /// Texts per class, indexed by label.
  std::vector<int64_t> class_counts() const;
};

/// A training and a test set over the same classes.
struct TextSplit {
  TextSet train;
  TextSet test;
};

/// Options of read_fortunes.
struct FortunesOptions {
  /// Leave out files with fewer records than this (Debian's `pratchett` has one).
  TORCH_ARG(int64_t, min_records) = 1;
  /// Only these files (class names), in this order; empty = every fortune file, sorted by name.
  TORCH_ARG(std::vector<std::string>, classes) = {};
};

/// The records of one fortune file: texts separated by lines holding only `%` (strfile's format), each
/// without its trailing newline; empty records are skipped. Throws DataError naming the file when it
/// cannot be opened or read.
std::vector<std::string> read_fortune_file(const std::string& path);

/// Every fortune file directly in `dir` as one class named after the file: regular files only, so the
/// `.u8` symlinks and the `off/` directory of offensive fortunes are left out, as are the `.dat` indexes
/// and hidden files. Throws DataError naming the path for a missing directory, a named class whose file is
/// missing, an unreadable file, or when no class is left.
TextSet read_fortunes(const std::string& dir, const FortunesOptions& options = {});

/// Splits each class of `set` with the same seeded shuffle: round(count × test_fraction) of its texts go
/// to the test set (at most count - 1, so every class keeps a training text), the rest to the training
/// set; both keep the order of `set`. The result depends only on the set, the fraction and the seed.
/// Throws std::invalid_argument for a fraction outside (0, 1).
TextSplit stratified_split(const TextSet& set, double test_fraction, uint64_t seed);

/// Reads the aclImdb layout: `dir/train/pos/*.txt`, `dir/train/neg/*.txt`, `dir/test/pos/*.txt`,
/// `dir/test/neg/*.txt`, one review per file, label = folder (classes {"neg", "pos"}: neg 0, pos 1), files
/// in name order. Other files and folders (`unsup/`, `*.feat`, `urls_*.txt`) are ignored. Throws DataError
/// naming the path for a missing folder, a folder without `.txt` files, or a `.txt` entry that is not a
/// readable regular file.
TextSplit read_aclimdb(const std::string& dir);

}  // namespace trainkit::data
