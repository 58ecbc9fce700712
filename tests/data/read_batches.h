#pragma once
// Reading a BatchSource in tests: the rest of the current epoch, or a whole epoch.
#include <cstdint>
#include <vector>

#include "trainkit/data/batch_source.h"

namespace trainkit::test {

/// Every batch `source` still yields in its current epoch.
inline std::vector<data::Batch> read_rest(data::BatchSource& source) {
  std::vector<data::Batch> out;
  while (auto b = source.next()) {
    out.push_back(std::move(*b));
  }
  return out;
}

/// Every batch of epoch `epoch` of `source`.
inline std::vector<data::Batch> read_epoch(data::BatchSource& source, int64_t epoch) {
  source.set_epoch(epoch);
  return read_rest(source);
}

}  // namespace trainkit::test
