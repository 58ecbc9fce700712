#pragma once
// CRC-32C, the checksum of TFRecord framing. Internal to trainkit::log; the tests check it against the
// published test vectors.

#include <cstddef>
#include <cstdint>

namespace trainkit::log::detail {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF).
/// `crc32c("123456789", 9) == 0xE3069283`.
uint32_t crc32c(const void* data, size_t n);

}  // namespace trainkit::log::detail
