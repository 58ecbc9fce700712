#pragma once
// What the journal tests of tests/tune/ (the library's OptunaJournal and journal-kept Study) and tests/app/
// (`trainkit tune`'s StudyJournal) share: the golden journal Python Optuna wrote, its space, and line access.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support.h"
#include "trainkit/tune/search_space.h"

namespace trainkit::test {

/// The space of scripts/golden_optuna.py; another `max_width` makes another space, which its study refuses.
inline tune::SearchSpace golden_space(int64_t max_width = 64) {
  return tune::SearchSpace()
      .add_float("lr", 1e-4, 1e-1, true)
      .add_int("width", 4, max_width)
      .add_categorical("act", {"relu", "tanh", "gelu"})
      .add_float("momentum", 0.0, 0.99);
}

/// A copy of the journal Python Optuna wrote (tests/golden/optuna/python_study.journal) in `tmp`.
inline std::string copy_golden(const TempDir& tmp) {
  const std::string path = tmp.str("python_study.journal");
  std::filesystem::copy_file(source_path("tests/golden/optuna/python_study.journal"), path);
  return path;
}

inline std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : lines) out << l << "\n";
}

/// The Python that TRAINKIT_PYTHON names (the project's venv, set by the ctest entries), or null.
inline const char* python_or_null() {
  const char* python = std::getenv("TRAINKIT_PYTHON");
  return python && *python && std::filesystem::exists(python) ? python : nullptr;
}

/// `text` in double quotes, for a shell command line.
inline std::string quoted(const std::string& text) { return "\"" + text + "\""; }

}  // namespace trainkit::test
