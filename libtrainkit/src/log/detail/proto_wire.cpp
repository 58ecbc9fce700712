#include "log/detail/proto_wire.h"

#include <cstring>

namespace trainkit::log::detail {
namespace {

void put_double_bits(std::string& out, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_le<uint64_t>(out, bits);
}

}  // namespace

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t number, WireType type) { put_varint(out, (uint64_t{number} << 3) | type); }

void put_varint_field(std::string& out, uint32_t number, uint64_t v) {
  put_key(out, number, kVarint);
  put_varint(out, v);
}

void put_double_field(std::string& out, uint32_t number, double v) {
  put_key(out, number, kFixed64);
  put_double_bits(out, v);
}

void put_float_field(std::string& out, uint32_t number, float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, number, kFixed32);
  put_le<uint32_t>(out, bits);
}

void put_bytes_field(std::string& out, uint32_t number, const std::string& bytes) {
  put_key(out, number, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_packed_doubles(std::string& out, uint32_t number, const std::vector<double>& values) {
  std::string packed;
  packed.reserve(values.size() * 8);
  for (double v : values) {
    put_double_bits(packed, v);
  }
  put_bytes_field(out, number, packed);
}

}  // namespace trainkit::log::detail
