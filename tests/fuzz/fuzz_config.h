#pragma once
/// @file
/// The input format of the config and factory targets: TOML text up to the first NUL byte, then
/// NUL-separated `--set` overrides (`section.key=value`).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainkit::fuzz {

/// TOML text and overrides of one input.
struct ConfigInput {
  std::string toml;
  std::vector<std::string> overrides;
};

/// Splits `data` as described above.
inline ConfigInput split_config_input(const uint8_t* data, size_t size) {
  ConfigInput input;
  const std::string all(reinterpret_cast<const char*>(data), size);
  size_t pos = all.find('\0');
  input.toml = all.substr(0, pos);
  while (pos != std::string::npos) {
    const size_t next = all.find('\0', pos + 1);
    input.overrides.push_back(all.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1));
    pos = next;
  }
  return input;
}

}  // namespace trainkit::fuzz
