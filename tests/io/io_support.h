#pragma once
// Helpers of the io tests: raw bytes of tensors in hex, the golden tensor tables, hand-made safetensors files.

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "support.h"

namespace trainkit::test {

/// The raw bytes of `t` (C order, this little-endian host's layout) in lowercase hex, as the golden
/// script's raw_hex() writes them.
inline std::string hex_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous().cpu();
  const auto* p = static_cast<const unsigned char*>(c.const_data_ptr());
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (int64_t i = 0; i < static_cast<int64_t>(c.nbytes()); ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

/// The safetensors name of a dtype.
inline std::string safetensors_dtype(at::ScalarType type) {
  switch (type) {
    case at::kDouble: return "F64";
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: return "?";
  }
}

/// One row of a golden tensor table (interop.toml's [[tensor]] and [[cnn_tensor]]).
struct GoldenTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string hex;
};

inline std::vector<GoldenTensor> golden_tensors(const toml::table& golden, const std::string& table) {
  std::vector<GoldenTensor> rows;
  for (const auto& node : *golden[table].as_array()) {
    const auto& row = *node.as_table();
    GoldenTensor g{row["name"].value<std::string>().value(), row["dtype"].value<std::string>().value(), {},
                   row["hex"].value<std::string>().value()};
    for (const auto& d : *row["shape"].as_array()) {
      g.shape.push_back(d.value<int64_t>().value());
    }
    rows.push_back(g);
  }
  return rows;
}

/// Checks that `tensors` holds exactly the golden `rows`, each with its dtype, shape and bytes.
template <class Dict>
void check_golden_tensors(const Dict& tensors, const std::vector<GoldenTensor>& rows) {
  REQUIRE(tensors.size() == rows.size());
  for (const auto& row : rows) {
    INFO(row.name);
    const at::Tensor* t = tensors.find(row.name);
    REQUIRE(t != nullptr);
    CHECK(safetensors_dtype(t->scalar_type()) == row.dtype);
    CHECK(t->sizes().vec() == row.shape);
    CHECK(hex_of(*t) == row.hex);
  }
}

/// Writes a safetensors file by hand: the 8-byte little-endian length of `header`, `header`, `data`.
inline void write_safetensors_raw(const std::string& path, const std::string& header, const std::string& data,
                                  uint64_t header_length) {
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) {
    out.put(static_cast<char>((header_length >> (8 * i)) & 0xff));
  }
  out << header << data;
}

inline void write_safetensors_raw(const std::string& path, const std::string& header, const std::string& data) {
  write_safetensors_raw(path, header, data, header.size());
}

/// A tensor of every dtype safetensors holds, with special values (NaN, -0, extremes), an odd shape, a
/// 0-d and an empty one; deterministic for `seed`.
inline std::vector<std::pair<std::string, at::Tensor>> every_dtype(uint64_t seed) {
  torch::manual_seed(seed);
  at::Tensor f64 = torch::randn({3, 2}, torch::kFloat64);
  f64[0][0] = std::numeric_limits<double>::quiet_NaN();
  f64[1][1] = -0.0;
  return {{"f64", f64},
          {"f32", torch::randn({2, 1, 3})},
          {"f32_scalar", torch::tensor(-1.5f)},
          {"f32_empty", torch::empty({2, 0})},
          {"f16", torch::randn({5}).to(torch::kHalf)},
          {"bf16", torch::randn({1, 3}).to(torch::kBFloat16)},
          {"i64", torch::tensor({INT64_MIN, INT64_MAX, int64_t{-3}})},
          {"i32", torch::randint(INT32_MIN, INT32_MAX, {2, 2}, torch::kInt32)},
          {"i16", torch::randint(-32768, 32767, {3}, torch::kInt16)},
          {"i8", torch::randint(-128, 127, {1, 1, 3}, torch::kInt8)},
          {"u8", torch::randint(0, 255, {7}, torch::kUInt8)},
          {"bool", torch::randint(0, 2, {2, 3}).to(torch::kBool)},
          {"bool_scalar", torch::tensor(false)}};
}

}  // namespace trainkit::test
