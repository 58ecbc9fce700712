#pragma once
// Histogram binning as PyTorch's SummaryWriter.add_histogram does it. Internal to trainkit::log.

#include <cstdint>
#include <optional>
#include <vector>

#include "trainkit/log/summary_writer.h"

namespace trainkit::log::detail {

/// Bins `values` as PyTorch's `make_histogram` does (numpy.histogram, then trimmed to the buckets
/// holding values plus one empty bucket on the left so the leftmost edge is kept).
/// `bins` empty: PyTorch's default "tensorflow" edges, 0 and ±1e-12·1.1^k up to 1e20.
/// `bins` = n: n equal-width buckets between min and max (min ± 0.5 when all values are equal).
/// Throws std::invalid_argument for no values, a non-finite value or `bins` < 1.
Histogram make_histogram(const std::vector<double>& values, std::optional<int64_t> bins = std::nullopt);

}  // namespace trainkit::log::detail
