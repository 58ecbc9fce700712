#include "trainkit/data/cifar.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace trainkit::data {
namespace {

constexpr int64_t kPixels = 3 * 32 * 32;
constexpr int64_t kRecord = 1 + kPixels;

}  // namespace

ImageSet read_cifar10_batches(const std::vector<std::string>& paths) {
  // Check every file's size before allocating, so that a wrong file fails without a large allocation.
  std::vector<int64_t> records;
  int64_t total = 0;
  for (const auto& path : paths) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) {
      throw DataError(fmt::format("{}: cannot read: {}", path, ec.message()));
    }
    if (size == 0 || size % kRecord != 0) {
      throw DataError(fmt::format("{}: {} bytes is not a whole number of {}-byte CIFAR-10 records (truncated, or "
                                  "not the binary version)",
                                  path, size, kRecord));
    }
    records.push_back(static_cast<int64_t>(size) / kRecord);
    total += records.back();
  }
  ImageSet set;
  set.images = at::empty({total, 3, 32, 32}, at::kByte);
  set.labels = at::empty({total}, at::kLong);
  auto* pixels = set.images.data_ptr<uint8_t>();
  auto* labels = set.labels.data_ptr<int64_t>();
  std::vector<char> buffer(static_cast<size_t>(kRecord));
  int64_t n = 0;
  for (size_t f = 0; f < paths.size(); ++f) {
    std::ifstream in(paths[f], std::ios::binary);
    if (!in) {
      throw DataError(fmt::format("{}: cannot open", paths[f]));
    }
    for (int64_t r = 0; r < records[f]; ++r, ++n) {
      if (!in.read(buffer.data(), kRecord)) {
        throw DataError(fmt::format("{}: read failed at record {}", paths[f], r));
      }
      const auto label = static_cast<unsigned char>(buffer[0]);
      if (label > 9) {
        throw DataError(fmt::format("{}: record {}: label {} is not in [0, 9]", paths[f], r, label));
      }
      labels[n] = label;
      std::memcpy(pixels + n * kPixels, buffer.data() + 1, static_cast<size_t>(kPixels));
    }
  }
  return set;
}

ImageSet load_cifar10_split(const std::string& dir, bool train, int64_t limit) {
  std::vector<std::string> paths;
  if (train) {
    for (int i = 1; i <= 5; ++i) {
      paths.push_back((std::filesystem::path(dir) / fmt::format("data_batch_{}.bin", i)).string());
    }
  } else {
    paths.push_back((std::filesystem::path(dir) / "test_batch.bin").string());
  }
  ImageSet set = read_cifar10_batches(paths);
  if (limit > 0 && limit < set.labels.size(0)) {
    set.images = set.images.narrow(0, 0, limit).clone();
    set.labels = set.labels.narrow(0, 0, limit).clone();
  }
  return set;
}

}  // namespace trainkit::data
