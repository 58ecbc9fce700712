// Fuzz target `idx`: data::read_idx over raw bytes (plain IDX, or gzip when the bytes start like gzip).
// Fuzz target `idx_gz`: the same bytes gzip-compressed first, so that arbitrary IDX content reaches the
// reader through zlib (raw mutations of a gzip file mostly exercise the corrupt-stream errors).

#include <zlib.h>

#include <string>

#include <ATen/core/Tensor.h>

#include "fuzz_target.h"
#include "trainkit/data/idx.h"

namespace {

/// `bytes` as a gzip stream (deflateInit2 with windowBits 15 + 16).
[[maybe_unused]] std::string gzip(const uint8_t* data, size_t size) {
  z_stream stream{};
  if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    trainkit::fuzz::fail("deflateInit2 failed");
  }
  std::string out(deflateBound(&stream, static_cast<uLong>(size)) + 32, '\0');
  stream.next_in = const_cast<Bytef*>(data);
  stream.avail_in = static_cast<uInt>(size);
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&stream, Z_FINISH);
  trainkit::fuzz::check(rc == Z_STREAM_END, "deflate did not finish");
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

/// Reads `path`; an accepted file must hold exactly header + numel bytes of content (`content_size`).
void read(const std::string& path, const uint8_t* content, size_t content_size) {
  try {
    const at::Tensor tensor = trainkit::data::read_idx(path);
    const size_t header = 4 + 4 * static_cast<size_t>(tensor.dim());
    trainkit::fuzz::check(header + static_cast<size_t>(tensor.numel()) == content_size,
                          "accepted an IDX file whose size differs from what its header declares");
    trainkit::fuzz::check(tensor.numel() == 0 || tensor.data_ptr<uint8_t>()[0] == content[header],
                          "first element differs from the file's first data byte");
  } catch (const trainkit::data::DataError&) {
    // rejected with the documented error
  }
}

}  // namespace

#if !defined(TRAINKIT_LIBFUZZER) || defined(TRAINKIT_FUZZ_idx_gz)
TRAINKIT_FUZZ_TARGET(idx_gz) {
  const std::string compressed = gzip(data, size);
  const std::string path = trainkit::fuzz::scratch_file(reinterpret_cast<const uint8_t*>(compressed.data()),
                                                        compressed.size(), "idx_gz");
  read(path, data, size);
  return 0;
}
#endif

#if !defined(TRAINKIT_LIBFUZZER) || defined(TRAINKIT_FUZZ_idx)
TRAINKIT_FUZZ_TARGET(idx) {
  const std::string path = trainkit::fuzz::scratch_file(data, size, "idx");
  const bool gzip_magic = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (gzip_magic) {
    try {
      trainkit::data::read_idx(path);
    } catch (const trainkit::data::DataError&) {
    }
  } else {
    read(path, data, size);
  }
  return 0;
}
#endif
