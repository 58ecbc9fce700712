#include "log/detail/tfrecord.h"

#include "log/detail/crc32c.h"
#include "log/detail/proto_wire.h"

namespace trainkit::log::detail {

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string frame_tfrecord(const std::string& data) {
  std::string header;
  put_le<uint64_t>(header, data.size());
  std::string record = header;
  put_le<uint32_t>(record, masked_crc32c(header.data(), header.size()));
  record += data;
  put_le<uint32_t>(record, masked_crc32c(data.data(), data.size()));
  return record;
}

}  // namespace trainkit::log::detail
