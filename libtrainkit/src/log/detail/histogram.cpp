#include "log/detail/histogram.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>

#include <fmt/format.h>

namespace trainkit::log::detail {
namespace {

void check_finite(const std::vector<double>& values) {
  for (double v : values) {
    if (!std::isfinite(v)) {
      throw std::invalid_argument(fmt::format("make_histogram: values must be finite, got {}", v));
    }
  }
}

// PyTorch's SummaryWriter.default_bins ("tensorflow"): -1e20.. -1e-12, 0, 1e-12 .. 1e20 in steps of 1.1x.
const std::vector<double>& default_bin_edges() {
  static const std::vector<double> edges = [] {
    std::vector<double> positive;
    for (double v = 1e-12; v < 1e20; v *= 1.1) {
      positive.push_back(v);
    }
    std::vector<double> all;
    all.reserve(2 * positive.size() + 1);
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) {
      all.push_back(-*it);
    }
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    return all;
  }();
  return edges;
}

}  // namespace

Histogram make_histogram(const std::vector<double>& values, std::optional<int64_t> bins) {
  if (values.empty()) {
    throw std::invalid_argument("make_histogram: the input has no element");
  }
  if (bins && *bins < 1) {
    throw std::invalid_argument(fmt::format("make_histogram: bins must be positive, got {}", *bins));
  }
  check_finite(values);
  Histogram h;
  h.min = *std::min_element(values.begin(), values.end());
  h.max = *std::max_element(values.begin(), values.end());
  h.num = static_cast<double>(values.size());
  for (double v : values) {
    h.sum += v;
    h.sum_squares += v * v;
  }

  std::vector<double> edges;
  if (bins) {
    // numpy.histogram(values, bins=n): linspace edges over [min, max], widened by 0.5 if empty.
    double first = h.min;
    double last = h.max;
    if (first == last) {
      first -= 0.5;
      last += 0.5;
    }
    const auto n = static_cast<size_t>(*bins);
    edges.resize(n + 1);
    const double step = (last - first) / static_cast<double>(n);
    for (size_t i = 0; i < n; ++i) {
      edges[i] = first + static_cast<double>(i) * step;
    }
    edges[n] = last;
  } else {
    edges = default_bin_edges();
  }

  // numpy semantics: bucket i holds [edges[i], edges[i+1]), the last one also its right edge;
  // values outside [edges.front(), edges.back()] are dropped.
  const size_t num_buckets = edges.size() - 1;
  std::vector<double> counts(num_buckets, 0.0);
  for (double v : values) {
    if (v < edges.front() || v > edges.back()) {
      continue;
    }
    auto i = static_cast<size_t>(std::upper_bound(edges.begin(), edges.end(), v) - edges.begin());
    counts[std::min(i, num_buckets) - 1] += 1.0;
  }

  // Trim to the support as PyTorch does; bucket_limit keeps right edges only, so an empty bucket is
  // kept on the left to carry the leftmost edge.
  size_t start = num_buckets;
  size_t end = 0;
  for (size_t i = 0; i < num_buckets; ++i) {
    if (counts[i] > 0) {
      start = std::min(start, i);
      end = i + 1;
    }
  }
  if (start == num_buckets) {
    throw std::invalid_argument("make_histogram: no value falls within the bins");
  }
  if (start > 0) {
    h.bucket.assign(counts.begin() + static_cast<std::ptrdiff_t>(start - 1),
                    counts.begin() + static_cast<std::ptrdiff_t>(end));
  } else {
    h.bucket.push_back(0.0);
    h.bucket.insert(h.bucket.end(), counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(end));
  }
  h.bucket_limit.assign(edges.begin() + static_cast<std::ptrdiff_t>(start),
                        edges.begin() + static_cast<std::ptrdiff_t>(end + 1));
  return h;
}

}  // namespace trainkit::log::detail
