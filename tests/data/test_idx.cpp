// IDX reader: the real Fashion-MNIST files against Python's reading of them (tests/golden/data.toml),
// and damaged copies, each of which must fail with an error naming the file and the problem.
#include <zlib.h>

#include <fstream>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/data/idx.h"

using trainkit::data::DataError;
using trainkit::data::read_idx;
using trainkit::test::TempDir;
using Catch::Matchers::Contains;

namespace {

std::string read_all_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) {
    out.append(buf, static_cast<size_t>(n));
  }
  gzclose(f);
  return out;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  gzclose(f);
}

std::string read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string idx_header(std::initializer_list<uint32_t> dims) {
  std::string h{'\0', '\0', '\x08', static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) {
      h.push_back(static_cast<char>((d >> s) & 0xff));
    }
  }
  return h;
}

int64_t byte_sum(const at::Tensor& t) { return t.to(torch::kInt64).sum().item<int64_t>(); }

}  // namespace

TEST_CASE("read_idx reads Debian's gzip'd Fashion-MNIST like Python does", "[data][idx]") {
  const auto& golden = trainkit::test::golden("data.toml");
  const std::string dir = trainkit::test::fashion_mnist_dir();
  for (const std::string split : {"train", "t10k"}) {
    SECTION(split) {
      const auto& g = *golden[split].as_table();
      const at::Tensor images = read_idx(dir + "/" + split + "-images-idx3-ubyte.gz");
      const at::Tensor labels = read_idx(dir + "/" + split + "-labels-idx1-ubyte.gz");
      const auto& shape = *g["images_shape"].as_array();
      REQUIRE(images.dim() == 3);
      for (int i = 0; i < 3; ++i) {
        CHECK(images.size(i) == shape[static_cast<size_t>(i)].value<int64_t>().value());
      }
      CHECK(images.scalar_type() == torch::kUInt8);
      CHECK(byte_sum(images) == g["images_byte_sum"].value<int64_t>().value());
      CHECK(byte_sum(images[0]) == g["image0_byte_sum"].value<int64_t>().value());
      CHECK(byte_sum(images[-1]) == g["image_last_byte_sum"].value<int64_t>().value());
      const auto& first = *g["labels_first"].as_array();
      for (size_t i = 0; i < first.size(); ++i) {
        CHECK(labels[static_cast<int64_t>(i)].item<int64_t>() == first[i].value<int64_t>().value());
      }
      const at::Tensor counts = torch::bincount(labels.to(torch::kInt64), {}, 10);
      const auto& gcounts = *g["label_counts"].as_array();
      for (int64_t c = 0; c < 10; ++c) {
        CHECK(counts[c].item<int64_t>() == gcounts[static_cast<size_t>(c)].value<int64_t>().value());
      }
    }
  }
}

TEST_CASE("load_mnist_split normalizes and limits", "[data][idx]") {
  const auto set = trainkit::data::load_mnist_split(trainkit::test::fashion_mnist_dir(), false, 1000);
  CHECK(set.images.sizes() == torch::IntArrayRef({1000, 1, 28, 28}));
  CHECK(set.labels.sizes() == torch::IntArrayRef({1000}));
  CHECK(set.images.scalar_type() == torch::kFloat32);
  CHECK(set.labels.scalar_type() == torch::kInt64);
  // (0 - mean) / std for a black pixel
  CHECK(set.images.min().item<double>() == Approx((0.0 - 0.2860) / 0.3530).epsilon(1e-6));
  trainkit::data::MnistDataset dataset(set);
  CHECK(dataset.size().value() == 1000);
  CHECK(dataset.get(3).target.item<int64_t>() == set.labels[3].item<int64_t>());
}

TEST_CASE("damaged IDX files fail with the file and the problem named", "[data][idx]") {
  TempDir tmp("idx");
  const std::string good_labels = read_all_gz(trainkit::test::fashion_mnist_dir() + "/t10k-labels-idx1-ubyte.gz");

  SECTION("missing file") {
    const std::string path = tmp.str("nope-idx1-ubyte.gz");
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path) && Contains("no such file"));
  }
  SECTION("bad magic") {
    const std::string path = tmp.str("magic.gz");
    std::string bytes = good_labels;
    bytes[0] = '\x12';
    write_gz(path, bytes);
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path) && Contains("bad magic"));
  }
  SECTION("unsupported element type") {
    const std::string path = tmp.str("type.gz");
    std::string bytes = good_labels;
    bytes[2] = '\x0d';
    write_gz(path, bytes);
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path) && Contains("element type"));
  }
  SECTION("truncated data inside a valid gzip stream") {
    const std::string path = tmp.str("short.gz");
    write_gz(path, good_labels.substr(0, good_labels.size() - 100));
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path) && Contains("truncated") && Contains("10000"));
  }
  SECTION("truncated gzip file") {
    const std::string path = tmp.str("cut.gz");
    const std::string gz = read_raw(trainkit::test::fashion_mnist_dir() + "/t10k-labels-idx1-ubyte.gz");
    write_raw(path, gz.substr(0, gz.size() / 2));
    REQUIRE_THROWS_AS(read_idx(path), DataError);
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path));
  }
  SECTION("corrupted gzip payload") {
    const std::string path = tmp.str("flip.gz");
    std::string gz = read_raw(trainkit::test::fashion_mnist_dir() + "/t10k-labels-idx1-ubyte.gz");
    gz[gz.size() / 2] = static_cast<char>(gz[gz.size() / 2] ^ 0x55);
    write_raw(path, gz);
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path));
  }
  SECTION("trailing bytes") {
    const std::string path = tmp.str("long.gz");
    write_gz(path, good_labels + "xyz");
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path) && Contains("trailing"));
  }
  SECTION("plain (not gzip'd) files are read too") {
    const std::string path = tmp.str("plain-idx1-ubyte");
    write_raw(path, idx_header({3}) + std::string("\x01\x02\x03", 3));
    const at::Tensor t = read_idx(path);
    CHECK(t.sizes() == torch::IntArrayRef({3}));
    CHECK(t[2].item<int64_t>() == 3);
  }
}

// The element count a header declared was allocated before any data was read (10^12 bytes: LibTorch's
// allocator failed with c10::Error instead of a DataError), and four large dimensions overflowed the 64-bit
// count. Now the count is checked against what the file can hold first. The same inputs are replayed
// through the fuzz harnesses (tests/fuzz/regressions/idx*/).
TEST_CASE("an IDX header declaring more data than the file can hold fails before allocating", "[data][idx]") {
  TempDir tmp("idx-huge");
  SECTION("plain file, 10^12 elements") {
    const std::string path = tmp.str("huge-idx2-ubyte");
    write_raw(path, idx_header({1000000, 1000000}) + "abcd");
    REQUIRE_THROWS_AS(read_idx(path), DataError);
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path) && Contains("promises 1000000000000 bytes") &&
                                            Contains("file holds 4"));
  }
  SECTION("gzip file, 10^12 elements") {
    const std::string path = tmp.str("huge-idx2-ubyte.gz");
    write_gz(path, idx_header({1000000, 1000000}) + "abcd");
    REQUIRE_THROWS_AS(read_idx(path), DataError);
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path) && Contains("promises 1000000000000 bytes") &&
                                            Contains("gzip file can hold"));
  }
  SECTION("four dimensions of 2^31: the product overflows 64 bits") {
    const std::string path = tmp.str("overflow-idx4-ubyte");
    write_raw(path, idx_header({1u << 31, 1u << 31, 1u << 31, 1u << 31}) + "abcd");
    REQUIRE_THROWS_AS(read_idx(path), DataError);
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path) && Contains("exceeds 2^63"));
  }
  SECTION("an empty shape whose other sizes multiply past 2^63 (found by the fuzz targets idx and idx_gz)") {
    const std::string path = tmp.str("empty-overflow-idx4-ubyte");
    write_raw(path, idx_header({0, 0x08040000u, 0x00010000u, 0x04000002u}));
    REQUIRE_THROWS_AS(read_idx(path), DataError);
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path) && Contains("exceeds 2^63"));
  }
  SECTION("a zero dimension makes the others irrelevant: an empty tensor") {
    const std::string path = tmp.str("empty-idx3-ubyte");
    write_raw(path, idx_header({1u << 31, 0, 1u << 31}));
    const at::Tensor t = read_idx(path);
    CHECK(t.numel() == 0);
    CHECK(t.size(0) == (int64_t{1} << 31));
  }
}

TEST_CASE("load_mnist_split checks that labels and images agree", "[data][idx]") {
  TempDir tmp("split");
  const std::string images = idx_header({4, 2, 2}) + std::string(16, '\x07');
  SECTION("count mismatch") {
    write_gz(tmp.str("t10k-images-idx3-ubyte.gz"), images);
    write_gz(tmp.str("t10k-labels-idx1-ubyte.gz"), idx_header({3}) + std::string("\x01\x02\x03", 3));
    REQUIRE_THROWS_WITH(trainkit::data::load_mnist_split(tmp.str(), false),
                        Contains("t10k-labels-idx1-ubyte.gz") && Contains("3 labels") && Contains("4 images"));
  }
  SECTION("label out of range") {
    write_gz(tmp.str("t10k-images-idx3-ubyte.gz"), images);
    write_gz(tmp.str("t10k-labels-idx1-ubyte.gz"), idx_header({4}) + std::string("\x01\x02\x0c\x00", 4));
    REQUIRE_THROWS_WITH(trainkit::data::load_mnist_split(tmp.str(), false),
                        Contains("t10k-labels-idx1-ubyte.gz") && Contains("label 12"));
  }
  SECTION("images file missing") {
    write_gz(tmp.str("t10k-labels-idx1-ubyte.gz"), idx_header({4}) + std::string(4, '\x01'));
    REQUIRE_THROWS_WITH(trainkit::data::load_mnist_split(tmp.str(), false),
                        Contains("t10k-images-idx3-ubyte") && Contains("missing"));
  }
}
