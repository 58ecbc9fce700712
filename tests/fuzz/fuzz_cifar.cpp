// Fuzz target `cifar`: data::read_cifar10_batches over one file of raw bytes.

#include <cstring>
#include <string>

#include <ATen/core/Tensor.h>

#include "fuzz_target.h"
#include "trainkit/data/cifar.h"

TRAINKIT_FUZZ_TARGET(cifar) {
  const std::string path = trainkit::fuzz::scratch_file(data, size, "cifar");
  constexpr size_t kRecord = 1 + 3 * 32 * 32;
  try {
    const trainkit::data::ImageSet set = trainkit::data::read_cifar10_batches({path});
    const auto n = static_cast<size_t>(set.labels.size(0));
    trainkit::fuzz::check(n * kRecord == size, "accepted a file that is not a whole number of records");
    for (size_t r = 0; r < n; ++r) {
      const int64_t label = set.labels.data_ptr<int64_t>()[r];
      trainkit::fuzz::check(label == data[r * kRecord] && label <= 9, "label differs from the record's first byte");
      trainkit::fuzz::check(std::memcmp(set.images.data_ptr<uint8_t>() + r * (kRecord - 1), data + r * kRecord + 1,
                                        kRecord - 1) == 0,
                            "pixels differ from the record's bytes");
    }
  } catch (const trainkit::data::DataError&) {
  }
  return 0;
}
