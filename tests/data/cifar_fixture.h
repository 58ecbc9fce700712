#pragma once
// CIFAR-10 binary records written by the tests themselves (the data set's format: a label byte, then the
// R, G and B 32x32 planes), with pixels and labels that are a known function of the record number.
#include <cstdint>
#include <fstream>
#include <string>

namespace trainkit::test {

/// The pixel byte of record `r` (numbered across files), channel c, row y, column x.
inline uint8_t cifar_pixel(int64_t r, int64_t c, int64_t y, int64_t x) { return static_cast<uint8_t>((r * 31 + c * 7 + y * 3 + x) % 251); }

/// Writes records first .. first + count - 1 with labels (r * 3) % 10.
inline void write_cifar_batch(const std::string& path, int64_t first, int64_t count) {
  std::ofstream out(path, std::ios::binary);
  for (int64_t r = first; r < first + count; ++r) {
    out.put(static_cast<char>((r * 3) % 10));
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t y = 0; y < 32; ++y) {
        for (int64_t x = 0; x < 32; ++x) {
          out.put(static_cast<char>(cifar_pixel(r, c, y, x)));
        }
      }
    }
  }
}

}  // namespace trainkit::test
