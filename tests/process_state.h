#pragma once
// Whether a process (not a child of the test, which could waitpid it) still runs.

#include <cstdint>
#include <fstream>
#include <string>

namespace trainkit::test {

/// Whether process `pid` still runs: it exists and is no zombie (a dead process that the container's init
/// has not reaped yet holds no port, GPU or file any more).
inline bool process_runs(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const auto paren = text.rfind(')');  // the state follows the command name, which may hold spaces
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

}  // namespace trainkit::test
