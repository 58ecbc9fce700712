#pragma once
// Protobuf wire encoding written by hand (https://protobuf.dev/programming-guides/encoding/): the few
// field kinds TensorBoard's messages need, so that trainkit depends on neither protobuf nor TensorFlow.
// Internal to trainkit::log.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainkit::log::detail {

/// The wire types of the field kinds written here.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

/// Appends `value`'s sizeof(T) low bytes, least significant first.
template <class T>
void put_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff));
  }
}

/// Appends `v` as a base-128 varint.
void put_varint(std::string& out, uint64_t v);
/// Appends a field key: `(number << 3) | type` as a varint.
void put_key(std::string& out, uint32_t number, WireType type);
/// A varint field (int32/int64/uint64/bool/enum).
void put_varint_field(std::string& out, uint32_t number, uint64_t v);
/// A double field (fixed64).
void put_double_field(std::string& out, uint32_t number, double v);
/// A float field (fixed32).
void put_float_field(std::string& out, uint32_t number, float v);
/// A length-delimited field: string, bytes or an embedded message.
void put_bytes_field(std::string& out, uint32_t number, const std::string& bytes);
/// A packed repeated double field.
void put_packed_doubles(std::string& out, uint32_t number, const std::vector<double>& values);

}  // namespace trainkit::log::detail
