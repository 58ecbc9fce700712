// trainkit_fuzz_replay DIR...: runs every fuzz target registered in this build over the files in
// DIR/<target>/ (a committed seed corpus, regression inputs of past findings), without libFuzzer. A
// crash, a broken invariant or an exception that escapes a harness ends the program with the input's
// name on stderr; a target with no input at all is an error too (its corpus went missing).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_registry.h"

namespace fs = std::filesystem;

namespace {

std::string current_input;  // NOLINT(cppcoreguidelines-avoid-non-const-global-variables): read by the handler

[[noreturn]] void on_terminate() {
  std::fprintf(stderr, "fuzz replay: an exception escaped the harness on input %s\n", current_input.c_str());
  if (auto error = std::current_exception()) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "  what(): %s\n", e.what());
    } catch (...) {
    }
  }
  std::abort();
}

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: %s DIR...  (runs each fuzz target over DIR/<target>/*)\n", argv[0]);
    return argc < 2 ? 2 : 0;
  }
  std::set_terminate(on_terminate);
  int failures = 0;
  for (const auto& [name, target] : trainkit::fuzz::registry()) {
    size_t inputs = 0;
    for (int i = 1; i < argc; ++i) {
      const fs::path dir = fs::path(argv[i]) / name;
      if (!fs::is_directory(dir)) {
        continue;
      }
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(dir)) {
        if (entry.is_regular_file()) {
          files.push_back(entry.path());
        }
      }
      std::sort(files.begin(), files.end());
      for (const auto& file : files) {
        current_input = file.string();
        const std::vector<uint8_t> bytes = read_bytes(file);
        target(bytes.data(), bytes.size());
        ++inputs;
      }
    }
    std::printf("%-12s %zu inputs\n", name.c_str(), inputs);
    if (inputs == 0) {
      std::fprintf(stderr, "fuzz replay: no input for target %s in any of the directories given\n", name.c_str());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
