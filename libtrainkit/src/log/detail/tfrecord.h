#pragma once
// TFRecord framing, the container format of TensorBoard event files. Internal to trainkit::log.

#include <cstddef>
#include <cstdint>
#include <string>

namespace trainkit::log::detail {

/// The TFRecord mask of a CRC-32C: `((crc >> 15) | (crc << 17)) + 0xA282EAD8` modulo 2^32.
uint32_t masked_crc32c(const void* data, size_t n);

/// `data` as one TFRecord: uint64 length, masked CRC-32C of those 8 bytes, the data, masked CRC-32C of the
/// data (all little-endian).
std::string frame_tfrecord(const std::string& data);

}  // namespace trainkit::log::detail
