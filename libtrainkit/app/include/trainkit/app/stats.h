#pragma once
/// @file
/// Small statistics for the programs' measurement tables (apps and benchmarks).

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace trainkit::app {

/// The median of `values` (the mean of the two middle values for an even count). Throws
/// std::invalid_argument when `values` is empty.
inline double median(std::vector<double> values) {
  if (values.empty()) {
    throw std::invalid_argument("median of no values");
  }
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace trainkit::app
