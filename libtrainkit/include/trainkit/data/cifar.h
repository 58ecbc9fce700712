#pragma once
/// @file
/// Reader for CIFAR-10's binary version (`cifar-10-batches-bin`: `data_batch_1.bin` ... `data_batch_5.bin`,
/// `test_batch.bin`). Each record is 1 label byte (0-9) then 3072 pixel bytes: the red, green and blue
/// 32x32 planes, row-major.

#include <cstdint>
#include <string>
#include <vector>

#include "trainkit/data/idx.h"

namespace trainkit::data {

/// Per-channel mean and standard deviation of CIFAR-10's training pixels scaled to [0, 1] (R, G, B).
constexpr double kCifar10Mean[3] = {0.4914, 0.4822, 0.4465};
constexpr double kCifar10Std[3] = {0.2470, 0.2435, 0.2616};

/// Reads CIFAR-10 binary batch files in order into `images` uint8 [N, 3, 32, 32] and `labels` int64 [N].
/// Throws DataError naming the file on a missing file, a size that is not a whole number of 3073-byte
/// records (truncated or not CIFAR-10) or a label outside [0, 9] (naming the record).
ImageSet read_cifar10_batches(const std::vector<std::string>& paths);

/// The training split (`data_batch_1.bin` ... `data_batch_5.bin`, 50k) or the test split (`test_batch.bin`,
/// 10k) from `dir`; `limit` > 0 keeps the first `limit` images. Pixels stay uint8 (normalize on the device).
ImageSet load_cifar10_split(const std::string& dir, bool train, int64_t limit = 0);

}  // namespace trainkit::data
