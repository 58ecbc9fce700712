#include "trainkit/tune/sobol.h"

#include <random>
#include <stdexcept>

#include <fmt/format.h>

namespace trainkit::tune {
namespace {

// new-joe-kuo-6.21201, dimensions 2..21: degree s, coefficients a, initial m_1..m_s.
struct JoeKuo {
  int s;
  uint32_t a;
  uint32_t m[7];
};
constexpr JoeKuo kTable[] = {
    {1, 0, {1}},
    {2, 1, {1, 3}},
    {3, 1, {1, 3, 1}},
    {3, 2, {1, 1, 1}},
    {4, 1, {1, 1, 3, 3}},
    {4, 4, {1, 3, 5, 13}},
    {5, 2, {1, 1, 5, 5, 17}},
    {5, 4, {1, 1, 5, 5, 5}},
    {5, 7, {1, 1, 7, 11, 19}},
    {5, 11, {1, 1, 5, 1, 1}},
    {5, 13, {1, 1, 1, 3, 11}},
    {5, 14, {1, 3, 5, 5, 31}},
    {6, 1, {1, 3, 3, 9, 7, 49}},
    {6, 13, {1, 1, 1, 15, 21, 21}},
    {6, 16, {1, 3, 1, 13, 27, 49}},
    {6, 19, {1, 1, 1, 15, 7, 5}},
    {6, 22, {1, 3, 1, 15, 13, 25}},
    {6, 25, {1, 1, 5, 5, 19, 61}},
    {7, 1, {1, 3, 7, 11, 23, 15, 103}},
    {7, 4, {1, 3, 7, 13, 13, 15, 69}},
};
static_assert(sizeof(kTable) / sizeof(kTable[0]) == Sobol::kMaxDims - 1, "one row per dimension after the first");

constexpr int kBits = 32;

}  // namespace

Sobol::Sobol(int64_t dims, int64_t seed) : dims_(dims) {
  if (dims < 1 || dims > kMaxDims) {
    throw std::invalid_argument(fmt::format("Sobol: dims must be in [1, {}], got {}", kMaxDims, dims));
  }
  v_.assign(static_cast<size_t>(dims), std::vector<uint32_t>(kBits));
  for (int b = 0; b < kBits; ++b) {
    v_[0][static_cast<size_t>(b)] = uint32_t{1} << (kBits - 1 - b);  // the van der Corput sequence
  }
  for (int64_t d = 1; d < dims; ++d) {
    const JoeKuo& row = kTable[d - 1];
    auto& v = v_[static_cast<size_t>(d)];
    for (int b = 0; b < kBits; ++b) {
      if (b < row.s) {
        v[static_cast<size_t>(b)] = row.m[b] << (kBits - 1 - b);
      } else {
        uint32_t x = v[static_cast<size_t>(b - row.s)] ^ (v[static_cast<size_t>(b - row.s)] >> row.s);
        for (int k = 1; k < row.s; ++k) {
          if ((row.a >> (row.s - 1 - k)) & 1U) {
            x ^= v[static_cast<size_t>(b - k)];
          }
        }
        v[static_cast<size_t>(b)] = x;
      }
    }
  }
  shift_.assign(static_cast<size_t>(dims), 0);
  if (seed >= 0) {
    std::mt19937_64 rng(static_cast<uint64_t>(seed));
    for (auto& s : shift_) {
      s = static_cast<uint32_t>(rng() >> 32);
    }
  }
}

std::vector<double> Sobol::point(uint64_t index) const {
  // Gray-code order: x_n = XOR of v[bit] over the set bits of gray(n) = n ^ (n >> 1), as scipy.
  const uint64_t gray = index ^ (index >> 1);
  std::vector<double> out(static_cast<size_t>(dims_));
  for (size_t d = 0; d < out.size(); ++d) {
    uint32_t x = shift_[d];
    for (int b = 0; b < kBits; ++b) {
      if ((gray >> b) & 1U) {
        x ^= v_[d][static_cast<size_t>(b)];
      }
    }
    out[d] = static_cast<double>(x) / 4294967296.0;
  }
  return out;
}

}  // namespace trainkit::tune
