// SummaryWriter images and hparams: tensor-to-image conversion and the hparams summaries equal PyTorch's
// (golden from torch.utils.tensorboard.summary), PNG round trips, and the events' protobuf layout.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <torch/torch.h>

#include "log/detail/hparams.h"
#include "log/detail/image.h"
#include "log/detail/png.h"
#include "support.h"
#include "trainkit/log/summary_writer.h"

using namespace trainkit;

namespace {

using trainkit::test::event_files;
using trainkit::test::read_text;

namespace fs = std::filesystem;

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::vector<int64_t> ints(const toml::array& a) {
  std::vector<int64_t> out;
  for (const auto& v : a) {
    out.push_back(v.value<int64_t>().value());
  }
  return out;
}

std::vector<double> doubles(const toml::array& a) { return trainkit::test::values_of<double>(a); }

at::Tensor golden_input(const toml::table& c) {
  const auto shape = ints(*c["shape"].as_array());
  const std::string dtype = c["dtype"].value<std::string>().value();
  const auto values = doubles(*c["input"].as_array());
  const at::Tensor t = torch::tensor(values, torch::kFloat64).reshape(shape);
  if (dtype == "uint8") {
    return t.to(torch::kByte);
  }
  return t.to(dtype == "float32" ? torch::kFloat32 : torch::kFloat64);
}

log::Image gradient_image(int64_t h, int64_t w, int64_t c) {
  log::Image img{h, w, c, {}};
  for (int64_t i = 0; i < h * w * c; ++i) {
    img.pixels.push_back(static_cast<uint8_t>((i * 37 + 11) % 256));
  }
  return img;
}

/// The serialized Events of a TFRecord file (CRCs are checked by test_summary_writer.cpp).
std::vector<std::string> records(const std::string& bytes) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos + 12 <= bytes.size()) {
    uint64_t n = 0;
    std::memcpy(&n, bytes.data() + pos, 8);
    out.push_back(bytes.substr(pos + 12, n));
    pos += 12 + n + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("make_image converts tensors as PyTorch's add_image", "[log][tensorboard][image][golden]") {
  const auto& g = trainkit::test::golden("log.toml");
  for (const auto& node : *g["image"].as_array()) {
    const auto& c = *node.as_table();
    DYNAMIC_SECTION(c["name"].value<std::string>().value()) {
      const log::Image img = log::detail::make_image(golden_input(c), c["dataformats"].value<std::string>().value());
      CHECK(img.height == c["height"].value<int64_t>().value());
      CHECK(img.width == c["width"].value<int64_t>().value());
      CHECK(img.channels == c["colorspace"].value<int64_t>().value());
      const auto expected = ints(*c["pixels"].as_array());
      REQUIRE(img.pixels.size() == expected.size());
      size_t mismatches = 0;
      for (size_t i = 0; i < expected.size(); ++i) {
        mismatches += img.pixels[i] != expected[i] ? 1 : 0;
      }
      CHECK(mismatches == 0);
      // What add_image stores decodes back to the same pixels.
      const log::Image back = log::detail::decode_png(log::detail::encode_png(img));
      CHECK(back.height == img.height);
      CHECK(back.width == img.width);
      CHECK(back.channels == img.channels);
      CHECK(back.pixels == img.pixels);
    }
  }
}

TEST_CASE("make_image edge cases and errors", "[log][tensorboard][image]") {
  SECTION("NaN becomes 0, values are clipped and truncated") {
    const at::Tensor t = torch::tensor({std::nanf(""), -1.0F, 0.5F, 2.0F, 0.999F, 0.004F}).reshape({1, 2, 3});
    const log::Image img = log::detail::make_image(t, "CHW");
    REQUIRE(img.channels == 3);
    std::vector<uint8_t> gray;
    for (size_t i = 0; i < img.pixels.size(); i += 3) {
      gray.push_back(img.pixels[i]);
    }
    CHECK(gray == std::vector<uint8_t>{0, 0, 127, 255, 254, 1});
  }
  SECTION("lower-case dataformats") {
    CHECK(log::detail::make_image(torch::zeros({2, 3}, torch::kByte), "hw").width == 3);
  }
  using trainkit::test::WhatContains;
  CHECK_THROWS_MATCHES(log::detail::make_image(torch::zeros({3, 4, 5}), "CHWX"), std::invalid_argument, WhatContains("CHWX"));
  CHECK_THROWS_MATCHES(log::detail::make_image(torch::zeros({3, 4, 5}), "CHH"), std::invalid_argument, WhatContains("CHH"));
  CHECK_THROWS_MATCHES(log::detail::make_image(torch::zeros({4, 5}), "CHW"), std::invalid_argument, WhatContains("4x5"));
  CHECK_THROWS_MATCHES(log::detail::make_image(torch::zeros({2, 4, 5}), "CHW"), std::invalid_argument,
                       WhatContains("2 channels"));
  CHECK_THROWS_MATCHES(log::detail::make_image(torch::zeros({2, 4, 3, 3}), "NCHW"), std::invalid_argument,
                       WhatContains("1 or 3 channels"));
  CHECK_THROWS_MATCHES(log::detail::make_image(torch::zeros({0, 3}), "HW"), std::invalid_argument, WhatContains("empty"));
}

TEST_CASE("PNG encoding round trips and rejects bad input", "[log][tensorboard][image]") {
  for (int64_t c : {1, 3, 4}) {
    DYNAMIC_SECTION(c << " channels") {
      const log::Image img = gradient_image(7, 13, c);
      const std::string png = log::detail::encode_png(img);
      CHECK(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
      const log::Image back = log::detail::decode_png(png);
      CHECK(back.height == 7);
      CHECK(back.width == 13);
      CHECK(back.channels == c);
      CHECK(back.pixels == img.pixels);
    }
  }
  using trainkit::test::WhatContains;
  log::Image bad = gradient_image(2, 2, 3);
  bad.pixels.pop_back();
  CHECK_THROWS_MATCHES(log::detail::encode_png(bad), std::invalid_argument, WhatContains("11 bytes"));
  CHECK_THROWS_MATCHES(log::detail::encode_png(gradient_image(2, 2, 2)), std::invalid_argument, WhatContains("2 channels"));
  CHECK_THROWS_MATCHES(log::detail::encode_png(log::Image{0, 3, 1, {}}), std::invalid_argument, WhatContains("0x3"));
  const std::string png = log::detail::encode_png(gradient_image(4, 4, 3));
  CHECK_THROWS_MATCHES(log::detail::decode_png(png.substr(0, png.size() / 2)), std::runtime_error, WhatContains("decode_png"));
  CHECK_THROWS_MATCHES(log::detail::decode_png("not a png"), std::runtime_error, WhatContains("decode_png"));
}

TEST_CASE("hparams summaries equal PyTorch's", "[log][tensorboard][hparams][golden]") {
  const auto& g = trainkit::test::golden("log.toml");
  for (const auto& node : *g["hparams"].as_array()) {
    const auto& c = *node.as_table();
    DYNAMIC_SECTION(c["name"].value<std::string>().value()) {
      std::vector<std::pair<std::string, log::HParamValue>> hp;
      const auto& names = *c["hparam_names"].as_array();
      const auto& values = *c["hparam_values"].as_array();
      for (size_t i = 0; i < names.size(); ++i) {
        const std::string name = names[i].value<std::string>().value();
        if (const auto s = values[i].value_exact<std::string>()) {
          hp.emplace_back(name, *s);
        } else {
          hp.emplace_back(name, values[i].value<double>().value());
        }
      }
      std::vector<std::pair<std::string, double>> metrics;
      const auto metric_values = doubles(*c["metric_values"].as_array());
      const auto& metric_names = *c["metric_names"].as_array();
      for (size_t i = 0; i < metric_names.size(); ++i) {
        metrics.emplace_back(metric_names[i].value<std::string>().value(), metric_values[i]);
      }
      const auto s = log::detail::make_hparams_summaries(hp, metrics);
      CHECK(to_hex(s.experiment) == c["experiment"].value<std::string>().value());
      CHECK(to_hex(s.session_start_info) == c["session_start_info"].value<std::string>().value());
      CHECK(to_hex(s.session_end_info) == c["session_end_info"].value<std::string>().value());
    }
  }
  using trainkit::test::WhatContains;
  CHECK_THROWS_MATCHES(log::detail::make_hparams_summaries({{"lr", 0.1}, {"lr", 0.2}}, {}), std::invalid_argument,
                       WhatContains("\"lr\" is given twice"));
  CHECK_THROWS_MATCHES(log::detail::make_hparams_summaries({{"", 0.1}}, {}), std::invalid_argument, WhatContains("empty"));
  CHECK_THROWS_MATCHES(log::detail::make_hparams_summaries({{"lr", 0.1}}, {{"acc", 1.0}, {"acc", 2.0}}), std::invalid_argument,
                       WhatContains("metric \"acc\""));
  // A bool stays a bool (PyTorch would write 1.0): Value.bool_value = field 4, varint 1.
  const auto b = log::detail::make_hparams_summaries({{"flag", true}}, {});
  CHECK(to_hex(b.session_start_info).find(to_hex(std::string("\x12\x02\x20\x01", 4))) != std::string::npos);
}

TEST_CASE("SummaryWriter writes image events and an hparams run", "[log][tensorboard][image][hparams]") {
  trainkit::test::TempDir tmp("summary-media");
  const std::string dir = tmp.str("run");
  log::SummaryWriter w(dir);
  w.add_image("inputs", torch::rand({4, 1, 5, 6}), 3, "NCHW");
  const std::string hp_dir = w.add_hparams({{"lr", 0.01}, {"optimizer", "sgd"}, {"bn", false}},
                                           {{"hparam/accuracy", 0.5}}, "trial-1", 7);
  w.close();
  CHECK(hp_dir == (fs::path(dir) / "trial-1").string());
  CHECK(w.add_hparams({{"lr", 0.1}}, {}, "after-close").empty());
  CHECK_FALSE(fs::exists(fs::path(dir) / "after-close"));

  const auto main_files = event_files(dir);
  REQUIRE(main_files.size() == 1);
  const auto events = records(read_text(main_files[0]));
  REQUIRE(events.size() == 2);
  // Event{summary(5){value(1){tag(1) "inputs", image(4){height(1) 5, width(2) 24, colorspace(3) 3, png(4)}}}}
  const std::string& e = events[1];
  CHECK(e.find(std::string("\x0a\x06inputs\x22", 9)) != std::string::npos);
  CHECK(e.find(std::string("\x08\x05\x10\x18\x18\x03\x22", 7)) != std::string::npos);
  const size_t png_at = e.find("\x89PNG");
  REQUIRE(png_at != std::string::npos);
  const log::Image back = log::detail::decode_png(e.substr(png_at));
  CHECK(back.height == 5);
  CHECK(back.width == 24);

  const auto hp_files = event_files(hp_dir);
  REQUIRE(hp_files.size() == 1);
  const auto hp_events = records(read_text(hp_files[0]));
  REQUIRE(hp_events.size() == 5);  // version, experiment, session start, session end, one metric
  const auto s = log::detail::make_hparams_summaries({{"lr", 0.01}, {"optimizer", "sgd"}, {"bn", false}}, {{"hparam/accuracy", 0.5}});
  CHECK(hp_events[1].find(s.experiment) != std::string::npos);
  CHECK(hp_events[2].find(s.session_start_info) != std::string::npos);
  CHECK(hp_events[3].find(s.session_end_info) != std::string::npos);
  CHECK(hp_events[4].find("hparam/accuracy") != std::string::npos);
  CHECK(hp_events[1].find(std::string("\x10\x07", 2)) != std::string::npos);  // step 7

  SECTION("a disabled writer writes no image and no hparams run") {
    log::SummaryWriter off(tmp.str("off"), log::SummaryWriterOptions().enabled(false));
    off.add_image("x", torch::zeros({3, 2, 2}), 0);
    CHECK(off.add_hparams({{"lr", 0.1}}, {}).empty());
    CHECK_FALSE(fs::exists(tmp.path() / "off"));
  }
}
