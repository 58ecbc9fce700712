#include "trainkit/data/idx.h"

#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace trainkit::data {
namespace {

namespace fs = std::filesystem;

/// A gzip or plain file read through zlib (gzread passes plain files through unchanged).
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (file_ == nullptr) {
      throw DataError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
    }
    gzbuffer(file_, 1 << 20);
  }
  ~GzFile() { gzclose(file_); }
  /// Whether the file is read as is (not gzip); known once the first bytes were read.
  bool plain() const { return gzdirect(file_) == 1; }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  /// Reads up to `n` bytes; throws on a corrupt stream. Returns the bytes read (short at end of data).
  size_t read(void* dst, size_t n, const char* what) {
    auto* out = static_cast<unsigned char*>(dst);
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(file_, out + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        throw DataError(fmt::format("{}: corrupt data while reading {}: {}", path_, what, msg));
      }
      if (got == 0) {
        break;
      }
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  std::string path_;
  gzFile file_;
};

/// Deflate's largest expansion: one compressed byte inflates to at most 1032 bytes (zlib's technical notes).
constexpr uint64_t kMaxInflateRatio = 1032;

uint32_t big_endian_u32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

/// `dir/name`, or `dir/name.gz` when only that exists.
std::string find_file(const std::string& dir, const std::string& name) {
  const fs::path plain = fs::path(dir) / name;
  const fs::path gz = fs::path(dir) / (name + ".gz");
  if (fs::exists(gz)) {
    return gz.string();
  }
  if (fs::exists(plain)) {
    return plain.string();
  }
  throw DataError(fmt::format("{}: missing (also looked for {})", gz.string(), plain.string()));
}

}  // namespace

at::Tensor read_idx(const std::string& path) {
  if (!fs::exists(path)) {
    throw DataError(fmt::format("{}: no such file", path));
  }
  GzFile file(path);
  std::array<unsigned char, 4> magic{};
  if (file.read(magic.data(), magic.size(), "the header") != magic.size()) {
    throw DataError(fmt::format("{}: truncated header (fewer than 4 bytes)", path));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    throw DataError(fmt::format("{}: bad magic {:02x}{:02x}{:02x}{:02x} (an IDX file starts with 0000)",
                                path, magic[0], magic[1], magic[2], magic[3]));
  }
  if (magic[2] != 0x08) {
    throw DataError(fmt::format("{}: unsupported element type 0x{:02x} (only unsigned byte, 0x08)", path,
                                magic[2]));
  }
  const int ndim = magic[3];
  if (ndim < 1 || ndim > 4) {
    throw DataError(fmt::format("{}: bad magic: {} dimensions (expected 1 to 4)", path, ndim));
  }
  std::vector<unsigned char> dims_raw(static_cast<size_t>(4 * ndim));
  if (file.read(dims_raw.data(), dims_raw.size(), "the dimensions") != dims_raw.size()) {
    throw DataError(fmt::format("{}: truncated header (dimension sizes missing)", path));
  }
  std::vector<int64_t> shape;
  for (int d = 0; d < ndim; ++d) {
    const int64_t size = big_endian_u32(dims_raw.data() + 4 * d);
    if (size > (int64_t{1} << 31)) {
      throw DataError(fmt::format("{}: dimension {} has implausible size {}", path, d, size));
    }
    shape.push_back(size);
  }
  // The sizes other than 0 must multiply to an int64 even when one is 0 (LibTorch checks that product).
  int64_t nonzero_product = 1;
  bool empty = false;
  for (const int64_t size : shape) {
    empty = empty || size == 0;
    if (size != 0 && __builtin_mul_overflow(nonzero_product, size, &nonzero_product)) {
      throw DataError(fmt::format("{}: header declares sizes [{}] whose product exceeds 2^63", path,
                                  fmt::join(shape, ", ")));
    }
  }
  // The element count is checked against what the file can hold before anything is allocated: a plain file
  // holds exactly its bytes after the header, a gzip file at most kMaxInflateRatio times its size.
  std::error_code size_error;
  const uint64_t file_size = fs::file_size(path, size_error);
  if (size_error) {
    throw DataError(fmt::format("{}: cannot read its size: {}", path, size_error.message()));
  }
  const uint64_t header = dims_raw.size() + 4;
  const bool plain = file.plain();
  const uint64_t capacity = plain ? (file_size > header ? file_size - header : 0) : file_size * kMaxInflateRatio;
  const uint64_t count = empty ? 0 : static_cast<uint64_t>(nonzero_product);
  if (count > capacity) {
    if (plain) {
      throw DataError(fmt::format("{}: truncated: header promises {} bytes of data, file holds {}", path, count,
                                  capacity));
    }
    throw DataError(fmt::format("{}: header promises {} bytes of data, more than a {}-byte gzip file can hold "
                                "(deflate expands at most {}x): corrupt or truncated",
                                path, count, file_size, kMaxInflateRatio));
  }
  at::Tensor out = torch::empty(shape, torch::kUInt8);
  const size_t got = file.read(out.data_ptr<uint8_t>(), static_cast<size_t>(count), "the data");
  if (got != static_cast<size_t>(count)) {
    throw DataError(fmt::format("{}: truncated: header promises {} bytes of data, file holds {}", path,
                                count, got));
  }
  unsigned char extra = 0;
  if (file.read(&extra, 1, "the end of the file") != 0) {
    throw DataError(fmt::format("{}: trailing bytes after the {} bytes the header describes", path, count));
  }
  return out;
}

ImageSet load_mnist_split_uint8(const std::string& dir, bool train, int64_t limit) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  at::Tensor images = read_idx(images_path);
  at::Tensor labels = read_idx(labels_path);
  if (images.dim() != 3) {
    throw DataError(fmt::format("{}: expected 3 dimensions (count, rows, cols), found {}", images_path,
                                images.dim()));
  }
  if (labels.dim() != 1) {
    throw DataError(fmt::format("{}: expected 1 dimension (count), found {}", labels_path, labels.dim()));
  }
  if (images.size(0) != labels.size(0)) {
    throw DataError(fmt::format("{}: holds {} labels but {} holds {} images", labels_path, labels.size(0),
                                images_path, images.size(0)));
  }
  if (labels.numel() > 0 && labels.max().item<int64_t>() > 9) {
    throw DataError(fmt::format("{}: label {} out of range [0, 9]", labels_path, labels.max().item<int64_t>()));
  }
  if (limit > 0 && limit < images.size(0)) {
    images = images.narrow(0, 0, limit);
    labels = labels.narrow(0, 0, limit);
  }
  ImageSet set;
  set.images = images.unsqueeze(1).contiguous();
  set.labels = labels.to(torch::kInt64).contiguous();
  return set;
}

ImageSet load_mnist_split(const std::string& dir, bool train, int64_t limit, double mean, double std) {
  ImageSet set = load_mnist_split_uint8(dir, train, limit);
  set.images = set.images.to(torch::kFloat32).div_(255.0).sub_(mean).div_(std).contiguous();
  return set;
}

MnistDataset::MnistDataset(ImageSet set) : set_(std::move(set)) {}

torch::data::Example<> MnistDataset::get(size_t index) {
  return {set_.images[static_cast<int64_t>(index)], set_.labels[static_cast<int64_t>(index)]};
}

torch::optional<size_t> MnistDataset::size() const { return static_cast<size_t>(set_.images.size(0)); }

}  // namespace trainkit::data
