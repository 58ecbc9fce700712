// safetensors files: Python's writer read bitwise (every dtype, odd shapes, 0-d, empty, metadata), the
// same bytes written back, C++ round trips, the memory map, and every kind of malformed file refused with
// the file and the entry named.
#include <filesystem>

#include <torch/torch.h>

#include "io/io_support.h"
#include "support.h"
#include "trainkit/io/safetensors.h"

using namespace trainkit::io;
using trainkit::test::TempDir;
using trainkit::test::WhatContains;

namespace {

TensorDict dict_of(const std::vector<std::pair<std::string, at::Tensor>>& items) {
  TensorDict d;
  for (const auto& [name, t] : items) {
    d.insert(name, t);
  }
  return d;
}

// Loading `path` throws IoError whose message names the file and contains each of `fragments`.
void expect_refused(const std::string& path, const std::vector<std::string>& fragments) {
  try {
    load_safetensors(path);
    FAIL("accepted " << path);
  } catch (const IoError& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find(path) != std::string::npos);
    for (const auto& f : fragments) {
      CHECK(what.find(f) != std::string::npos);
    }
  }
}

const std::string kF32Entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

}  // namespace

TEST_CASE("safetensors written by Python read bitwise, every dtype", "[io][safetensors][golden]") {
  const auto& golden = trainkit::test::golden("interop.toml");
  const std::string path = trainkit::test::source_path("tests/golden/interop/dtypes.safetensors");
  const SafetensorsFile file = load_safetensors(path);
  const auto rows = trainkit::test::golden_tensors(golden, "tensor");
  trainkit::test::check_golden_tensors(file.tensors, rows);
  std::set<std::string> dtypes;
  for (const auto& row : rows) {
    dtypes.insert(row.dtype);
  }
  CHECK(dtypes.size() == 10);
  CHECK(file.metadata == std::map<std::string, std::string>{
                             {"generated", golden["metadata"]["generated"].value<std::string>().value()}});

  SECTION("trainkit writes the same bytes for the same tensors") {
    TempDir tmp("st-same-bytes");
    save_safetensors(tmp.str("again.safetensors"), file.tensors, file.metadata);
    CHECK(trainkit::test::read_text(tmp.str("again.safetensors")) == trainkit::test::read_text(path));
  }
}

TEST_CASE("safetensors round trip in C++: every dtype bitwise, metadata, views, any order",
          "[io][safetensors]") {
  TempDir tmp("st-round-trip");
  const auto items = trainkit::test::every_dtype(3);
  TensorDict tensors = dict_of(items);
  const at::Tensor base = torch::arange(12, torch::kFloat32).reshape({3, 4});
  tensors.insert("transposed_view", base.t());
  tensors.insert("slice_view", base.slice(1, 1, 3));
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"note", "ünïcode \"quoted\""}};
  const std::string path = tmp.str("all.safetensors");
  save_safetensors(path, tensors, metadata);
  const SafetensorsFile file = load_safetensors(path);
  CHECK(file.metadata == metadata);
  REQUIRE(file.tensors.size() == tensors.size());
  for (const auto& item : tensors) {
    INFO(item.key());
    const at::Tensor& got = file.tensors[item.key()];
    CHECK(got.scalar_type() == item.value().scalar_type());
    CHECK(got.sizes() == item.value().sizes());
    CHECK(trainkit::test::hex_of(got) == trainkit::test::hex_of(item.value()));
  }
  // The header is padded to 8 bytes and tensors follow in the reference writer's dtype order.
  const std::string bytes = trainkit::test::read_text(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) {
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  CHECK(n % 8 == 0);
  CHECK(file.tensors.keys().front() == "i64");
  CHECK(file.tensors.keys().back() == "bool_scalar");

  SECTION("an empty map and no metadata") {
    save_safetensors(tmp.str("empty.safetensors"), TensorDict{});
    const SafetensorsFile empty = load_safetensors(tmp.str("empty.safetensors"));
    CHECK(empty.tensors.is_empty());
    CHECK(empty.metadata.empty());
  }
}

TEST_CASE("safetensors tensors share a private map of the file", "[io][safetensors]") {
  TempDir tmp("st-mmap");
  const std::string path = tmp.str("w.safetensors");
  save_safetensors(path, dict_of({{"w", torch::arange(1000, torch::kFloat32)}}));
  const std::string before = trainkit::test::read_text(path);
  at::Tensor w = load_safetensors(path).tensors["w"];
  w.mul_(2);  // copy-on-write: the file stays as it was
  CHECK(trainkit::test::read_text(path) == before);
  std::filesystem::remove(path);  // the map outlives the name
  CHECK(w[999].item<float>() == 1998.0f);
  CHECK(w.sum().item<double>() == 999.0 * 1000.0);

  SECTION("a tensor that is not aligned in the file is copied out") {
    // A header padded to 2 modulo 4 (the reference writer pads to 8): the F32 data is not 4-byte aligned.
    std::string padded = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    while ((8 + padded.size()) % 4 != 2) {
      padded += ' ';
    }
    const float values[2] = {1.5f, -2.25f};
    trainkit::test::write_safetensors_raw(tmp.str("odd.safetensors"), padded,
                                          std::string(reinterpret_cast<const char*>(values), 8));
    const at::Tensor a = load_safetensors(tmp.str("odd.safetensors")).tensors["a"];
    CHECK(a[0].item<float>() == 1.5f);
    CHECK(a[1].item<float>() == -2.25f);
  }
}

TEST_CASE("safetensors refuses malformed files, naming the file and the entry", "[io][safetensors][errors]") {
  TempDir tmp("st-errors");
  const std::string path = tmp.str("bad.safetensors");
  const std::string eight(8, '\0');
  SECTION("missing file") { expect_refused(tmp.str("none.safetensors"), {"cannot open"}); }
  SECTION("shorter than the length field") {
    std::ofstream(path, std::ios::binary) << "abc";
    expect_refused(path, {"truncated", "3 bytes"});
  }
  SECTION("header length larger than the file") {
    trainkit::test::write_safetensors_raw(path, "{}", "", 1000);
    expect_refused(path, {"truncated", "header length is 1000"});
  }
  SECTION("truncated data") {
    trainkit::test::write_safetensors_raw(path, "{" + kF32Entry + "}", "1234");
    expect_refused(path, {"'w'", "past the end"});
  }
  SECTION("not JSON") {
    trainkit::test::write_safetensors_raw(path, "{\"w\":", "");
    expect_refused(path, {"not valid JSON"});
  }
  SECTION("JSON that is not an object") {
    trainkit::test::write_safetensors_raw(path, "[1, 2]", "");
    expect_refused(path, {"array, not an object"});
  }
  SECTION("an entry that is not an object") {
    trainkit::test::write_safetensors_raw(path, R"({"w":3})", "");
    expect_refused(path, {"'w'", "not a JSON object"});
  }
  SECTION("unknown dtype") {
    trainkit::test::write_safetensors_raw(path, R"({"z":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})",
                                          eight);
    expect_refused(path, {"'z'", "unknown dtype 'C64'"});
  }
  SECTION("shape and offsets disagree") {
    trainkit::test::write_safetensors_raw(path, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                                          eight);
    expect_refused(path, {"'w'", "needs 12 bytes", "hold 8"});
  }
  SECTION("overlapping offsets") {
    trainkit::test::write_safetensors_raw(
        path, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}})",
        eight);
    expect_refused(path, {"'b'", "overlap tensor 'a'"});
  }
  SECTION("a hole between tensors") {
    trainkit::test::write_safetensors_raw(
        path, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
        eight);
    expect_refused(path, {"'b'", "hole of 2 bytes"});
  }
  SECTION("bytes after the last tensor") {
    trainkit::test::write_safetensors_raw(path, "{" + kF32Entry + "}", eight + "xy");
    expect_refused(path, {"2 bytes of data after the last tensor"});
  }
  SECTION("negative and reversed offsets") {
    trainkit::test::write_safetensors_raw(path, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})",
                                          eight);
    expect_refused(path, {"'w'", "non-negative integer"});
    trainkit::test::write_safetensors_raw(path, R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})",
                                          eight);
    expect_refused(path, {"'w'", "end before they begin"});
  }
  SECTION("a shape whose size overflows") {
    trainkit::test::write_safetensors_raw(
        path, R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", eight);
    expect_refused(path, {"'w'", "overflows"});
  }
  SECTION("metadata that is not strings") {
    trainkit::test::write_safetensors_raw(path, R"({"__metadata__":{"epoch":3}})", "");
    expect_refused(path, {"__metadata__", "'epoch'", "not a string"});
  }
  SECTION("BOOL bytes other than 0 and 1") {
    trainkit::test::write_safetensors_raw(path, R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})",
                                          std::string("\x01\x00\x02", 3));
    expect_refused(path, {"'m'", "element 2", "byte 2"});
  }
  SECTION("deeply nested JSON") {
    trainkit::test::write_safetensors_raw(path, "{\"w\":{\"shape\":[[[[[[[[1]]]]]]]]}}", "");
    expect_refused(path, {"nests deeper"});
  }
}

TEST_CASE("safetensors names may hold brackets, braces and escaped quotes", "[io][safetensors]") {
  // The header's nesting check reads the JSON text before it is parsed: brackets inside names are text.
  TempDir tmp("st-names");
  const std::string path = tmp.str("names.safetensors");
  trainkit::test::write_safetensors_raw(
      path, R"({"a[[[[{{{{\"}":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b\\":{"dtype":"U8","shape":[1],)"
            R"("data_offsets":[1,2]}})",
      std::string("\x07\x09", 2));
  const auto file = trainkit::io::load_safetensors(path);
  REQUIRE(file.tensors.size() == 2);
  CHECK(file.tensors["a[[[[{{{{\"}"].item<uint8_t>() == 7);
  CHECK(file.tensors["b\\"].item<uint8_t>() == 9);
}

TEST_CASE("save_safetensors rejects what the format cannot hold", "[io][safetensors][errors]") {
  TempDir tmp("st-save-errors");
  const std::string path = tmp.str("x.safetensors");
  CHECK_THROWS_MATCHES(save_safetensors(path, dict_of({{"c", torch::zeros({2}, torch::kComplexFloat)}})),
                       std::invalid_argument, WhatContains("'c' has dtype ComplexFloat"));
  CHECK_THROWS_MATCHES(save_safetensors(path, dict_of({{"__metadata__", torch::zeros({2})}})), std::invalid_argument,
                       WhatContains("__metadata__"));
  CHECK_THROWS_MATCHES(save_safetensors(path, dict_of({{"u", at::Tensor()}})), std::invalid_argument,
                       WhatContains("'u' is undefined"));
  CHECK_THROWS_MATCHES(save_safetensors(path, dict_of({{"bad\xff", torch::zeros({1})}})), std::invalid_argument,
                       WhatContains("not UTF-8"));
  CHECK_THROWS_MATCHES(save_safetensors(tmp.str("no/such/dir/x.safetensors"), dict_of({{"a", torch::zeros({1})}})),
                       IoError, WhatContains("cannot create"));
  CHECK_FALSE(std::filesystem::exists(path));
}
