// CIFAR-10 binary reader: records written here in the data set's format (label byte, then the R, G and B
// 32x32 planes) read back to the same labels and pixels in NCHW order; splits, limit; bad files named.
#include <fstream>
#include <vector>

#include <torch/torch.h>

#include "data/cifar_fixture.h"
#include "support.h"
#include "trainkit/data/cifar.h"

using namespace trainkit;
using Catch::Matchers::Contains;
using trainkit::test::TempDir;
using trainkit::test::cifar_pixel;
using trainkit::test::write_cifar_batch;

namespace {

void check_records(const data::ImageSet& set, int64_t first, int64_t count) {
  REQUIRE(set.images.sizes() == at::IntArrayRef({count, 3, 32, 32}));
  REQUIRE(set.images.scalar_type() == at::kByte);
  REQUIRE(set.labels.sizes() == at::IntArrayRef({count}));
  REQUIRE(set.labels.scalar_type() == at::kLong);
  const auto images = set.images.accessor<uint8_t, 4>();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = first + i;
    CHECK(set.labels[i].item<int64_t>() == (r * 3) % 10);
    bool all_equal = true;
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t y = 0; y < 32; ++y) {
        for (int64_t x = 0; x < 32; ++x) {
          all_equal = all_equal && images[i][c][y][x] == cifar_pixel(r, c, y, x);
        }
      }
    }
    CHECK(all_equal);
  }
}

}  // namespace

TEST_CASE("CIFAR-10 binary batches read back to labels and NCHW pixels", "[data][cifar]") {
  TempDir tmp("cifar");
  write_cifar_batch(tmp.str("a.bin"), 0, 3);
  write_cifar_batch(tmp.str("b.bin"), 3, 2);
  check_records(data::read_cifar10_batches({tmp.str("a.bin"), tmp.str("b.bin")}), 0, 5);

  for (int i = 1; i <= 5; ++i) {
    write_cifar_batch(tmp.str("data_batch_" + std::to_string(i) + ".bin"), 2 * (i - 1), 2);
  }
  write_cifar_batch(tmp.str("test_batch.bin"), 100, 3);
  check_records(data::load_cifar10_split(tmp.str(), true), 0, 10);
  check_records(data::load_cifar10_split(tmp.str(), true, 7), 0, 7);
  check_records(data::load_cifar10_split(tmp.str(), false), 100, 3);
}

TEST_CASE("CIFAR-10 reader: bad files are named", "[data][cifar]") {
  TempDir tmp("cifar-bad");
  write_cifar_batch(tmp.str("good.bin"), 0, 2);
  // Truncated: one byte short of two records.
  {
    std::ifstream in(tmp.str("good.bin"), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(tmp.str("short.bin"), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 1));
    bytes[3073] = 10;  // the second record's label
    std::ofstream(tmp.str("label.bin"), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::ofstream(tmp.str("empty.bin"), std::ios::binary);
  CHECK_THROWS_MATCHES(data::read_cifar10_batches({tmp.str("good.bin"), tmp.str("short.bin")}), data::DataError,
                       trainkit::test::WhatContains("short.bin: 6145 bytes is not a whole number of 3073-byte"));
  CHECK_THROWS_MATCHES(data::read_cifar10_batches({tmp.str("empty.bin")}), data::DataError,
                       trainkit::test::WhatContains("empty.bin: 0 bytes"));
  CHECK_THROWS_MATCHES(data::read_cifar10_batches({tmp.str("label.bin")}), data::DataError,
                       trainkit::test::WhatContains("label.bin: record 1: label 10 is not in [0, 9]"));
  CHECK_THROWS_MATCHES(data::load_cifar10_split(tmp.str(), false), data::DataError,
                       trainkit::test::WhatContains("test_batch.bin: cannot read"));
}
