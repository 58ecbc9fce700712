#include "trainkit/log/summary_writer.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "log/detail/crc32c.h"
#include "log/detail/histogram.h"
#include "log/detail/tfrecord.h"
#include "support.h"

namespace {

using trainkit::test::event_files;
using trainkit::test::read_text;

namespace fs = std::filesystem;
using trainkit::log::SummaryWriter;
using trainkit::log::SummaryWriterOptions;

uint64_t get_le(const std::string& s, size_t pos, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(s[pos + i])) << (8 * i);
  }
  return v;
}

/// The records of a TFRecord file, checking both masked CRCs; stops at a truncated record.
struct Records {
  std::vector<std::string> events;
  bool truncated = false;
  bool crc_ok = true;
};

Records read_records(const std::string& bytes) {
  Records r;
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (bytes.size() - pos < 12) {
      r.truncated = true;
      break;
    }
    const uint64_t length = get_le(bytes, pos, 8);
    if (get_le(bytes, pos + 8, 4) != trainkit::log::detail::masked_crc32c(bytes.data() + pos, 8)) {
      r.crc_ok = false;
      break;
    }
    if (bytes.size() - pos - 12 < length + 4) {
      r.truncated = true;
      break;
    }
    const std::string data = bytes.substr(pos + 12, length);
    if (get_le(bytes, pos + 12 + length, 4) != trainkit::log::detail::masked_crc32c(data.data(), data.size())) {
      r.crc_ok = false;
      break;
    }
    r.events.push_back(data);
    pos += 12 + length + 4;
  }
  return r;
}

/// One protobuf field: its number, wire type and either the integer (varint/fixed) or the bytes.
struct Field {
  uint32_t number = 0;
  uint32_t type = 0;
  uint64_t integer = 0;
  std::string bytes;
};

std::vector<Field> parse_message(const std::string& s) {
  std::vector<Field> fields;
  size_t pos = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0; pos < s.size(); shift += 7) {
      const auto b = static_cast<unsigned char>(s[pos++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        return v;
      }
    }
    FAIL("truncated varint");
    return v;
  };
  while (pos < s.size()) {
    Field f;
    const uint64_t key = varint();
    f.number = static_cast<uint32_t>(key >> 3);
    f.type = static_cast<uint32_t>(key & 7);
    switch (f.type) {
      case 0: f.integer = varint(); break;
      case 1: f.integer = get_le(s, pos, 8); pos += 8; break;
      case 5: f.integer = get_le(s, pos, 4); pos += 4; break;
      case 2: {
        const uint64_t n = varint();
        f.bytes = s.substr(pos, n);
        pos += n;
        break;
      }
      default: FAIL("unexpected wire type " << f.type);
    }
    REQUIRE(pos <= s.size());
    fields.push_back(f);
  }
  return fields;
}

const Field* find(const std::vector<Field>& fields, uint32_t number) {
  for (const auto& f : fields) {
    if (f.number == number) {
      return &f;
    }
  }
  return nullptr;
}

double as_double(uint64_t bits) {
  double d = 0;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

float as_float(uint64_t bits) {
  const auto b = static_cast<uint32_t>(bits);
  float f = 0;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

/// The single Summary.Value of an event (fields of Value), with the event's step.
struct DecodedValue {
  int64_t step = 0;
  std::vector<Field> value;
};

DecodedValue decode_summary_event(const std::string& event) {
  const auto fields = parse_message(event);
  DecodedValue out;
  REQUIRE(find(fields, 1) != nullptr);  // wall_time
  if (const Field* step = find(fields, 2)) {
    out.step = static_cast<int64_t>(step->integer);
  }
  const Field* summary = find(fields, 5);
  REQUIRE(summary != nullptr);
  const auto summary_fields = parse_message(summary->bytes);
  const Field* value = find(summary_fields, 1);
  REQUIRE(value != nullptr);
  out.value = parse_message(value->bytes);
  return out;
}

/// Copies `src` to `dst` without the last `cut` bytes.
void truncated_copy(const fs::path& src, const fs::path& dst, size_t cut) {
  const std::string bytes = read_text(src);
  REQUIRE(bytes.size() > cut);
  std::ofstream(dst, std::ios::binary) << bytes.substr(0, bytes.size() - cut);
}

/// Writes the same events to `dir` for the C++ and the Python read-back: 7 records in the main file.
void write_sample(const std::string& dir) {
  SummaryWriter w(dir);
  w.add_scalar("loss", 0.5, 0);
  w.add_scalar("loss", 0.25, 1);
  w.add_scalar("loss", 1.25, 2, 1700000000.5);
  w.add_text("notes", "hello **world**", 2);
  w.add_histogram("weights", std::vector<double>{1, 2, 3, 4}, 5);
  w.add_scalar("lr", -0.125, 123456789012LL);
  w.add_scalars("split", {{"train", 0.5}, {"val", 0.75}}, 3);
  w.close();
  w.close();  // idempotent
  w.add_scalar("ignored", 1.0, 9);  // after close: ignored
}

}  // namespace

TEST_CASE("crc32c matches the Castagnoli test vectors", "[log][tensorboard]") {
  using trainkit::log::detail::crc32c;
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  std::array<unsigned char, 32> bytes{};
  CHECK(crc32c(bytes.data(), bytes.size()) == 0x8A9136AAu);
  bytes.fill(0xFF);
  CHECK(crc32c(bytes.data(), bytes.size()) == 0x62A8AB43u);
  std::iota(bytes.begin(), bytes.end(), static_cast<unsigned char>(0));
  CHECK(crc32c(bytes.data(), bytes.size()) == 0x46DD794Eu);
  CHECK(crc32c("", 0) == 0u);
  const uint32_t crc = crc32c("123456789", 9);
  CHECK(trainkit::log::detail::masked_crc32c("123456789", 9) == static_cast<uint32_t>(((crc >> 15) | (crc << 17)) + 0xA282EAD8u));
}

TEST_CASE("make_histogram bins as PyTorch", "[log][tensorboard]") {
  using trainkit::log::detail::make_histogram;
  SECTION("equal-width bins keep an empty bucket on the left") {
    const auto h = make_histogram({1, 2, 3, 4}, 3);
    CHECK(h.min == 1);
    CHECK(h.max == 4);
    CHECK(h.num == 4);
    CHECK(h.sum == 10);
    CHECK(h.sum_squares == 30);
    CHECK(h.bucket_limit == std::vector<double>{1, 2, 3, 4});
    CHECK(h.bucket == std::vector<double>{0, 1, 1, 2});
  }
  SECTION("trimmed to the buckets holding values") {
    // numpy.histogram([0, 0, 9], bins=3) -> edges 0,3,6,9, counts 2,0,1
    const auto h = make_histogram({0, 9, 0}, 3);
    CHECK(h.bucket_limit == std::vector<double>{0, 3, 6, 9});
    CHECK(h.bucket == std::vector<double>{0, 2, 0, 1});
    // all equal: numpy widens the range by 0.5 on each side
    const auto same = make_histogram({2, 2}, 2);
    CHECK(same.bucket_limit == std::vector<double>{2.0, 2.5});
    CHECK(same.bucket == std::vector<double>{0, 2});
  }
  SECTION("default TensorFlow bins") {
    const auto h = make_histogram({0.5, -3.0, 0.5});
    REQUIRE(h.bucket.size() == h.bucket_limit.size());
    CHECK(std::accumulate(h.bucket.begin(), h.bucket.end(), 0.0) == 3);
    CHECK(h.bucket.front() == 0);
    CHECK(h.bucket_limit.front() <= -3.0);
    CHECK(h.bucket_limit.back() > 0.5);
    CHECK(h.bucket_limit.back() < 0.5 * 1.1 + 1e-9);
    // From PyTorch: make_histogram(np.array([0.5, -3, 0.5]), SummaryWriter(...).default_bins)
    CHECK(h.bucket.size() == 588);
    CHECK(h.bucket_limit.front() == Approx(-3.1665833053880363).epsilon(1e-14));
    CHECK(h.bucket_limit.back() == Approx(0.5177616740489182).epsilon(1e-14));
  }
  CHECK_THROWS_AS(make_histogram({}), std::invalid_argument);
  CHECK_THROWS_AS(make_histogram({1.0, std::nan("")}), std::invalid_argument);
  CHECK_THROWS_AS(make_histogram({1.0}, 0), std::invalid_argument);
}

TEST_CASE("SummaryWriter writes TFRecord-framed events", "[log][tensorboard]") {
  trainkit::test::TempDir tmp("summary-writer");
  const std::string dir = tmp.str("run/a");  // parents are created
  write_sample(dir);

  const auto files = event_files(dir);
  REQUIRE(files.size() == 1);
  const std::string name = files[0].filename().string();
  CHECK(name.rfind("events.out.tfevents.", 0) == 0);
  CHECK(name.size() > std::string("events.out.tfevents.1700000000..1.0").size());

  const Records records = read_records(read_text(files[0]));
  CHECK(records.crc_ok);
  CHECK_FALSE(records.truncated);
  REQUIRE(records.events.size() == 7);

  // First record: wall_time and file_version, nothing else.
  const auto first = parse_message(records.events[0]);
  REQUIRE(first.size() == 2);
  CHECK(first[0].number == 1);
  CHECK(first[0].type == 1);
  CHECK(as_double(first[0].integer) > 1.6e9);
  CHECK(first[1].number == 3);
  CHECK(first[1].bytes == "brain.Event:2");

  // Scalars: tag, simple_value (fixed32), step.
  const std::vector<std::pair<int64_t, float>> expected{{0, 0.5f}, {1, 0.25f}, {2, 1.25f}};
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto v = decode_summary_event(records.events[1 + i]);
    CHECK(v.step == expected[i].first);
    REQUIRE(find(v.value, 1) != nullptr);
    CHECK(find(v.value, 1)->bytes == "loss");
    const Field* simple = find(v.value, 2);
    REQUIRE(simple != nullptr);
    CHECK(simple->type == 5);
    CHECK(as_float(simple->integer) == expected[i].second);
  }
  CHECK(as_double(find(parse_message(records.events[3]), 1)->integer) == 1700000000.5);

  // Text: tag + "/text_summary", tensor with DT_STRING and the text, metadata plugin "text".
  const auto text = decode_summary_event(records.events[4]);
  CHECK(text.step == 2);
  CHECK(find(text.value, 1)->bytes == "notes/text_summary");
  const auto tensor = parse_message(find(text.value, 8)->bytes);
  CHECK(find(tensor, 1)->integer == 7);
  CHECK(find(tensor, 8)->bytes == "hello **world**");
  const auto dim = parse_message(find(parse_message(find(tensor, 2)->bytes), 2)->bytes);
  CHECK(find(dim, 1)->integer == 1);
  const auto plugin = parse_message(find(parse_message(find(text.value, 9)->bytes), 1)->bytes);
  CHECK(find(plugin, 1)->bytes == "text");

  // Histogram: HistogramProto with packed doubles.
  const auto histo_value = decode_summary_event(records.events[5]);
  CHECK(histo_value.step == 5);
  CHECK(find(histo_value.value, 1)->bytes == "weights");
  const auto histo = parse_message(find(histo_value.value, 5)->bytes);
  CHECK(as_double(find(histo, 1)->integer) == 1);
  CHECK(as_double(find(histo, 2)->integer) == 4);
  CHECK(as_double(find(histo, 3)->integer) == 4);
  CHECK(as_double(find(histo, 4)->integer) == 10);
  CHECK(as_double(find(histo, 5)->integer) == 30);
  const std::string limits = find(histo, 6)->bytes;
  const std::string counts = find(histo, 7)->bytes;
  CHECK(limits.size() == counts.size());
  REQUIRE(counts.size() % 8 == 0);
  double total = 0;
  for (size_t i = 0; i < counts.size(); i += 8) {
    total += as_double(get_le(counts, i, 8));
  }
  CHECK(total == 4);

  // A large step is a varint beyond 32 bits.
  const auto lr = decode_summary_event(records.events[6]);
  CHECK(lr.step == 123456789012LL);
  CHECK(as_float(find(lr.value, 2)->integer) == -0.125f);

  // add_scalars: one file per sub-directory, tag main_tag.
  for (const auto& [sub, value] : std::vector<std::pair<std::string, float>>{{"split_train", 0.5f}, {"split_val", 0.75f}}) {
    const auto sub_files = event_files(fs::path(dir) / sub);
    REQUIRE(sub_files.size() == 1);
    const Records sub_records = read_records(read_text(sub_files[0]));
    CHECK(sub_records.crc_ok);
    REQUIRE(sub_records.events.size() == 2);
    const auto v = decode_summary_event(sub_records.events[1]);
    CHECK(v.step == 3);
    CHECK(find(v.value, 1)->bytes == "split");
    CHECK(as_float(find(v.value, 2)->integer) == value);
  }
}

TEST_CASE("A truncated event file reads up to its last complete record", "[log][tensorboard]") {
  trainkit::test::TempDir tmp("summary-writer-cut");
  write_sample(tmp.str("run"));
  const auto files = event_files(tmp.str("run"));
  REQUIRE(files.size() == 1);
  const std::string bytes = read_text(files[0]);
  // The last record is the "lr" scalar: cut inside its data, its data CRC and its header.
  for (size_t cut : {size_t{1}, size_t{4}, size_t{10}, size_t{20}}) {
    INFO("cut " << cut << " bytes");
    const Records records = read_records(bytes.substr(0, bytes.size() - cut));
    CHECK(records.crc_ok);
    CHECK(records.truncated);
    CHECK(records.events.size() == 6);
  }
  // A flipped bit is caught by the data CRC.
  std::string corrupt = bytes;
  corrupt[corrupt.size() - 6] = static_cast<char>(corrupt[corrupt.size() - 6] ^ 1);
  const Records bad = read_records(corrupt);
  CHECK_FALSE(bad.crc_ok);
  CHECK(bad.events.size() == 6);
}

TEST_CASE("SummaryWriter options and errors", "[log][tensorboard]") {
  trainkit::test::TempDir tmp("summary-writer-opts");
  SECTION("a disabled writer creates nothing") {
    SummaryWriter w(tmp.str("disabled"), SummaryWriterOptions().enabled(false));
    w.add_scalar("loss", 1.0, 1);
    w.add_scalars("split", {{"a", 1.0}}, 1);
    w.add_text("t", "x", 1);
    w.add_histogram("h", std::vector<double>{1.0}, 1);
    w.flush();
    w.close();
    CHECK(w.file_path().empty());
    CHECK_FALSE(fs::exists(tmp.path() / "disabled"));
  }
  SECTION("filename_suffix, flush_secs = 0 flushes every event, counter makes names unique") {
    SummaryWriter a(tmp.str("s"), SummaryWriterOptions().filename_suffix(".rank0").flush_secs(0));
    SummaryWriter b(tmp.str("s"), SummaryWriterOptions().filename_suffix(".rank0"));
    CHECK(a.file_path() != b.file_path());
    CHECK(a.file_path().size() > 6);
    CHECK(a.file_path().substr(a.file_path().size() - 6) == ".rank0");
    a.add_scalar("loss", 0.5, 1);
    CHECK(read_records(read_text(a.file_path())).events.size() == 2);  // flushed without close
    b.add_scalar("loss", 0.5, 1);
    b.flush();
    CHECK(read_records(read_text(b.file_path())).events.size() == 2);
  }
  SECTION("a log_dir that cannot be created names the path") {
    std::ofstream(tmp.path() / "file") << "x";
    const std::string bad = tmp.str("file/sub");
    CHECK_THROWS_MATCHES(SummaryWriter(bad), std::runtime_error, trainkit::test::WhatContains(bad));
  }
  SECTION("an invalid flush_secs is rejected") {
    CHECK_THROWS_AS(SummaryWriter(tmp.str("x"), SummaryWriterOptions().flush_secs(-1)), std::invalid_argument);
  }
  SECTION("the destructor closes and flushes") {
    std::string path;
    {
      SummaryWriter w(tmp.str("d"));
      w.add_scalar("loss", 0.5, 1);
      path = w.file_path();
    }
    CHECK(read_records(read_text(path)).events.size() == 2);
  }
}

// Run by the ctest `tensorboard_reads_summary_writer`, which sets TRAINKIT_PYTHON to the project's venv.
TEST_CASE("TensorBoard's Python loader reads SummaryWriter files", "[.tensorboard-python]") {
  const char* python = std::getenv("TRAINKIT_PYTHON");
  if (python == nullptr || *python == '\0' || !fs::exists(python)) {
    FAIL("TRAINKIT_PYTHON must name a Python with the tensorboard package (got "
         << (python ? python : "nothing") << "); run through ctest -R tensorboard_reads_summary_writer");
  }
  trainkit::test::TempDir tmp("summary-writer-py");
  const std::string run = tmp.str("run");
  write_sample(run);
  fs::create_directories(tmp.path() / "cut");
  const auto files = event_files(run);
  REQUIRE(files.size() == 1);
  truncated_copy(files[0], tmp.path() / "cut" / files[0].filename(), 10);

  auto read_back = [&](const std::string& dir) {
    const std::string out = tmp.str("out.json");
    const std::string command = std::string("\"") + python + "\" \"" +
                                trainkit::test::source_path("scripts/read_tfevents.py") + "\" \"" + dir + "\" > \"" +
                                out + "\"";
    INFO(command);
    REQUIRE(std::system(command.c_str()) == 0);
    return read_text(out);
  };

  const std::string json = read_back(run);
  INFO(json);
  CHECK(json.find(R"(".":{"events":7,"file_version":["brain.Event:2"])") != std::string::npos);
  CHECK(json.find(R"("loss":[[0,0.5],[1,0.25],[2,1.25]])") != std::string::npos);
  CHECK(json.find(R"("lr":[[123456789012,-0.125]])") != std::string::npos);
  CHECK(json.find(R"("texts":{"notes/text_summary":[[2,"hello **world**"]]})") != std::string::npos);
  CHECK(json.find(R"("histograms":{"weights":[[5,1.0,4.0,4.0,10.0]]})") != std::string::npos);
  CHECK(json.find(R"("split_train":{"events":2,)") != std::string::npos);
  CHECK(json.find(R"("scalars":{"split":[[3,0.5]]})") != std::string::npos);
  CHECK(json.find(R"("scalars":{"split":[[3,0.75]]})") != std::string::npos);
  CHECK(json.find(R"("migrated_events":7,)") != std::string::npos);

  // Images and hparams: the decoded pixels and the parsed hparams equal what was written.
  const std::string media = tmp.str("media");
  {
    SummaryWriter w(media);
    const at::Tensor hwc = torch::tensor({0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 255},
                                         torch::kByte)
                               .reshape({2, 3, 3});
    w.add_image("img/hwc", hwc, 4, "HWC");
    w.add_image("img/gray", torch::tensor({0.0F, 0.25F, 0.5F, 1.0F}).reshape({1, 2, 2}), 5);  // CHW, float
    w.add_hparams({{"lr", 0.01}, {"optimizer", "adam"}, {"batch_norm", true}}, {{"hparam/accuracy", 0.875}}, "hp");
  }
  const std::string media_json = read_back(media);
  INFO(media_json);
  CHECK(media_json.find(R"("img/hwc":[[4,2,3,3,[2,3],[0,10,20,30,40,50,60,70,80,90,100,110,120,130,140,150,160,255]]])") !=
        std::string::npos);
  CHECK(media_json.find(R"("img/gray":[[5,2,2,3,[2,2],[0,0,0,63,63,63,127,127,127,255,255,255]]])") != std::string::npos);
  CHECK(media_json.find(R"("hparams":{"experiment":{"hparams":[["lr","DATA_TYPE_FLOAT64"],["optimizer","DATA_TYPE_STRING"],)"
                        R"(["batch_norm","DATA_TYPE_BOOL"]],"metrics":["hparam/accuracy"]},"session_end":"STATUS_SUCCESS",)"
                        R"("session_start":{"batch_norm":true,"lr":0.01,"optimizer":"adam"}})") != std::string::npos);
  CHECK(media_json.find(R"("scalars":{"hparam/accuracy":[[0,0.875]]})") != std::string::npos);
  CHECK(media_json.find(R"("hp":{"events":5,)") != std::string::npos);
  CHECK(media_json.find(R"("migrated_events":5,)") != std::string::npos);
  CHECK(media_json.find(R"(".":{"events":3,)") != std::string::npos);

  const std::string cut = read_back(tmp.str("cut"));
  INFO(cut);
  CHECK(cut.find(R"("events":6,)") != std::string::npos);
  CHECK(cut.find(R"("loss":[[0,0.5],[1,0.25],[2,1.25]])") != std::string::npos);
  CHECK(cut.find(R"("lr")") == std::string::npos);
}
