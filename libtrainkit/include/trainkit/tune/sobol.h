#pragma once
/// @file
/// The Sobol low-discrepancy sequence (Sobol 1967) with Joe and Kuo's direction numbers
/// (new-joe-kuo-6.21201, Joe & Kuo 2008, SIAM J. Sci. Comput. 30(5)), for the initial design of a study.
/// Unscrambled, its points equal scipy.stats.qmc.Sobol(d, scramble=False); with a seed, a random digital
/// shift (every coordinate's bits XOR a fixed random word) keeps the (t, m, s)-net property.

#include <cstdint>
#include <vector>

namespace trainkit::tune {

/// A Sobol sequence generator in up to Sobol::kMaxDims dimensions, 32-bit precision.
class Sobol {
 public:
  /// Most dimensions supported (the first 21 of Joe–Kuo's table).
  static constexpr int64_t kMaxDims = 21;

  /// `dims` in [1, kMaxDims] (std::invalid_argument otherwise). `seed` < 0: unscrambled; otherwise a
  /// digital shift drawn from `seed`.
  explicit Sobol(int64_t dims, int64_t seed = -1);

  int64_t dims() const { return dims_; }
  /// Point `index` of the sequence (index 0 is the origin when unscrambled), coordinates in [0, 1).
  std::vector<double> point(uint64_t index) const;

 private:
  int64_t dims_;
  std::vector<std::vector<uint32_t>> v_;  // direction numbers, v_[dim][bit]
  std::vector<uint32_t> shift_;
};

}  // namespace trainkit::tune
