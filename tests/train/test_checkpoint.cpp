// Checkpoint files: round trip, every kind of damage detected and named, atomic replacement under an
// injected failure, pruning to the last K and falling back to the newest good file.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <zlib.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include "support.h"
#include "trainkit/train/checkpoint.h"

using namespace trainkit::train;
using trainkit::test::TempDir;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

torch::serialize::OutputArchive archive_with(double value) {
  torch::serialize::OutputArchive a;
  a.write("x", torch::full({3}, value, torch::kFloat64));
  return a;
}

double value_in(torch::serialize::InputArchive& a) {
  at::Tensor x;
  a.read("x", x);
  return x[0].item<double>();
}

double load_value(const std::string& path) {
  torch::serialize::InputArchive a;
  load_checkpoint(path, a);
  return value_in(a);
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("checkpoint files round-trip and reject damage by name", "[train][checkpoint]") {
  TempDir tmp("ckpt");
  const std::string path = tmp.str("a.tkpt");
  auto out = archive_with(2.5);
  save_checkpoint(path, out);
  CHECK(load_value(path) == 2.5);
  const std::string good = bytes_of(path);

  SECTION("truncated") {
    write_bytes(path, good.substr(0, good.size() - 7));
    CHECK_THROWS_WITH(load_value(path), Contains(path) && Contains("truncated"));
    write_bytes(path, good.substr(0, 10));
    CHECK_THROWS_WITH(load_value(path), Contains(path) && Contains("truncated"));
  }
  SECTION("corrupted payload byte") {
    std::string bad = good;
    bad[bad.size() - 20] = static_cast<char>(bad[bad.size() - 20] ^ 0x01);
    write_bytes(path, bad);
    CHECK_THROWS_WITH(load_value(path), Contains(path) && Contains("CRC"));
  }
  SECTION("not a checkpoint") {
    write_bytes(path, std::string(100, 'z'));
    CHECK_THROWS_WITH(load_value(path), Contains(path) && Contains("bad magic"));
  }
  SECTION("newer format version") {
    std::string bad = good;
    bad[8] = 99;
    write_bytes(path, bad);
    CHECK_THROWS_WITH(load_value(path), Contains(path) && Contains("format version 99"));
  }
  SECTION("missing") {
    CHECK_THROWS_WITH(load_value(tmp.str("none.tkpt")), Contains("none.tkpt"));
  }
}

TEST_CASE("a failure between write and rename leaves the previous checkpoint intact", "[train][checkpoint]") {
  TempDir tmp("atomic");
  CheckpointManager manager(tmp.str("ckpts"), 3);
  auto first = archive_with(1.0);
  const std::string p1 = manager.save(1, first);

  // Overwriting the same file: the failure must leave the old bytes.
  manager.set_before_rename([] { throw std::runtime_error("injected crash before rename"); });
  auto second = archive_with(2.0);
  CHECK_THROWS_WITH(save_checkpoint(p1, second, [] { throw std::runtime_error("injected"); }), "injected");
  CHECK(load_value(p1) == 1.0);
  // A new step: no file appears, no temporary file is left behind.
  CHECK_THROWS_WITH(manager.save(2, second), Contains("injected crash"));
  CHECK(manager.list() == std::vector<std::string>{p1});
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.str("ckpts"))) {
    ++entries;
  }
  CHECK(entries == 1);
  torch::serialize::InputArchive latest;
  CHECK(manager.load_latest(latest) == p1);
  CHECK(value_in(latest) == 1.0);

  manager.set_before_rename({});
  CHECK(load_value(manager.save(2, second)) == 2.0);
}

TEST_CASE("a checkpoint is never written through a link planted at its temporary's name", "[train][checkpoint]") {
  trainkit::test::TempDir tmp("ckpt-link");
  const std::string dir = tmp.str("ckpts");
  fs::create_directories(dir);
  const std::string victim = tmp.str("victim.txt");
  std::ofstream(victim) << "not yours";
  // A link to the victim at the name the temporary of checkpoint 7 had in this process (".<name>.tmp.<pid>").
  const std::string base = dir + "/.ckpt-000000007.tkpt.tmp." + std::to_string(::getpid());
  fs::create_symlink(victim, base);
  trainkit::train::CheckpointManager manager(dir, 2);
  torch::serialize::OutputArchive archive;
  archive.write("x", torch::ones({2}));
  const std::string saved = manager.save(7, archive);
  std::ifstream victim_in(victim);
  const std::string victim_text((std::istreambuf_iterator<char>(victim_in)), std::istreambuf_iterator<char>());
  CHECK(victim_text == "not yours");
  CHECK(fs::is_symlink(base));  // left alone: not ours
  torch::serialize::InputArchive in;
  trainkit::train::load_checkpoint(saved, in);
  at::Tensor x;
  in.read("x", x);
  CHECK(torch::equal(x, torch::ones({2})));
}

TEST_CASE("a checkpoint whose archive carries code is refused before anything of it loads", "[train][checkpoint]") {
  // A real checkpoint's archive, rewritten with one method added to its top-level class: TorchScript's
  // loader would compile it (and would run a __setstate__ while loading).
  torch::serialize::OutputArchive archive;
  archive.write("x", torch::ones({2}));
  std::ostringstream clean;
  archive.save_to(clean);
  std::istringstream clean_in(clean.str());
  caffe2::serialize::PyTorchStreamReader reader(&clean_in);
  std::string payload;
  caffe2::serialize::PyTorchStreamWriter writer([&payload](const void* data, size_t n) {
    payload.append(static_cast<const char*>(data), n);
    return n;
  });
  for (const std::string& name : reader.getAllRecords()) {
    if (name == "version" || name == ".data/version" || name == ".data/serialization_id") {
      continue;  // the writer adds its own
    }
    auto [data, size] = reader.getRecord(name);
    std::string record(static_cast<const char*>(data.get()), size);
    if (name == "code/__torch__.py") {
      record += "  def forward(self) -> int:\n    return 1\n";
    }
    writer.writeRecord(name, record.data(), record.size());
  }
  writer.writeEndOfFile();
  std::string file = "TKCKPT\r\n";
  const auto put = [&file](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) {
      file.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    }
  };
  put(kCheckpointFormatVersion, 4);
  put(0, 4);
  put(payload.size(), 8);
  put(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()), static_cast<uInt>(payload.size())), 4);
  put(0, 4);
  file += payload;
  trainkit::test::TempDir tmp("ckpt-code");
  const std::string path = tmp.str("code.tkpt");
  std::ofstream(path, std::ios::binary) << file;
  torch::serialize::InputArchive in;
  CHECK_THROWS_MATCHES(load_checkpoint(path, in), CheckpointError,
                       trainkit::test::WhatContains("refused: the archive carries code (code/__torch__.py line") &&
                           trainkit::test::WhatContains("def forward(self) -> int:"));
  CHECK_THROWS_AS(digest_checkpoint(path), CheckpointError);
}

TEST_CASE("the manager keeps the last K and falls back to the newest good one", "[train][checkpoint]") {
  TempDir tmp("keep");
  CheckpointManager manager(tmp.str(), 2);
  for (int step = 1; step <= 5; ++step) {
    auto a = archive_with(step);
    manager.save(step * 10, a);
  }
  const auto files = manager.list();
  REQUIRE(files.size() == 2);
  CHECK(fs::path(files[0]).filename() == "ckpt-000000040.tkpt");
  CHECK(fs::path(files[1]).filename() == "ckpt-000000050.tkpt");

  const std::string newest = bytes_of(files[1]);
  write_bytes(files[1], newest.substr(0, newest.size() / 2));  // a crash mid-copy, say
  torch::serialize::InputArchive a;
  CHECK(manager.load_latest(a) == files[0]);
  CHECK(value_in(a) == 4.0);

  write_bytes(files[0], "garbage");
  torch::serialize::InputArchive none;
  CHECK_FALSE(manager.load_latest(none).has_value());
  CHECK_THROWS_AS(CheckpointManager(tmp.str(), 0), std::invalid_argument);
}

TEST_CASE("digest_parameters tells bitwise-equal parameters from ones a float32 ulp apart, buffers aside",
          "[train][checkpoint][digest]") {
  const auto make = [] {
    torch::manual_seed(0);
    return torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  };
  auto a = make();
  auto b = make();
  REQUIRE(digest_parameters(*a) == digest_parameters(*b));
  torch::NoGradGuard no_grad;
  b[1]->named_buffers()["running_mean"].fill_(0.5);  // a rank's own BatchNorm statistics
  CHECK(digest_parameters(*a) == digest_parameters(*b));
  at::Tensor weight = b[0]->named_parameters()["weight"].view(-1);
  weight[5] = std::nextafter(weight[5].item<float>(), 1.0f);
  CHECK(digest_parameters(*a) != digest_parameters(*b));
}
