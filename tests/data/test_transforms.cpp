// Batch image transforms against element-by-element references computed here (random_erasing against
// torchvision's RandomErasing, tests/golden/data.toml), and DeviceSource:
// pass-through, crop/flip/normalize/erasing equal to the standalone transforms on the batch's generator, reproducible per
// (seed, epoch, batch) augmentation, resume, input selection.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "data/detail/epoch_order.h"
#include "data/read_batches.h"
#include "support.h"
#include "trainkit/data/device_source.h"
#include "trainkit/data/transforms.h"

using trainkit::data::Batch;
using trainkit::data::DeviceSource;
using trainkit::data::DeviceTransformOptions;
using trainkit::test::read_epoch;
using trainkit::test::WhatContains;

namespace {

at::Generator generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

at::Tensor images_u8(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = generator(seed);
  return torch::randint(0, 256, shape, gen, torch::TensorOptions().dtype(torch::kUInt8));
}


}  // namespace

TEST_CASE("normalize is (x/255 - mean)/std per channel in float32", "[data][transforms]") {
  const at::Tensor x = images_u8({2, 3, 4, 5}, 1);
  const std::vector<double> mean{0.1, 0.2, 0.3};
  const std::vector<double> std{0.5, 0.6, 0.7};
  const at::Tensor y = trainkit::data::normalize(x, mean, std);
  CHECK(y.scalar_type() == torch::kFloat);
  const auto xa = x.accessor<uint8_t, 4>();
  const auto ya = y.accessor<float, 4>();
  double worst = 0;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t i = 0; i < 4; ++i) {
        for (int64_t j = 0; j < 5; ++j) {
          const double expected = (xa[b][c][i][j] / 255.0 - mean[c]) / std[c];
          worst = std::max(worst, std::abs(expected - ya[b][c][i][j]));
        }
      }
    }
  }
  CHECK(worst < 1e-6);
  SECTION("[B, H, W] with one mean; floating input is not rescaled") {
    const at::Tensor g = images_u8({2, 4, 4}, 2);
    const at::Tensor expected = ((g.to(torch::kDouble) / 255 - 0.5) / 0.25).to(torch::kFloat);
    CHECK(torch::allclose(trainkit::data::normalize(g, {0.5}, {0.25}), expected, 1e-6, 1e-6));
    const at::Tensor f = torch::rand({2, 1, 3, 3});
    CHECK(torch::allclose(trainkit::data::normalize(f, {0.5}, {2.0}), (f - 0.5) / 2.0));
  }
  SECTION("bad arguments") {
    CHECK_THROWS_MATCHES(trainkit::data::normalize(x, {0.1, 0.2}, {1.0, 1.0}), std::invalid_argument,
                         WhatContains("2 mean/std values for 3 channels"));
    CHECK_THROWS_MATCHES(trainkit::data::normalize(x, {0.1}, {0.0}), std::invalid_argument, WhatContains("std: 0"));
    CHECK_THROWS_MATCHES(trainkit::data::normalize(x[0][0], {0.1}, {1.0}), std::invalid_argument,
                         WhatContains("[B, C, H, W]"));
  }
}

TEST_CASE("random_crop equals zero padding then a crop at the drawn offsets", "[data][transforms]") {
  const int64_t b = 6, c = 2, h = 5, w = 7, p = 2;
  const at::Tensor x = images_u8({b, c, h, w}, 3);
  auto gen = generator(42);
  const at::Tensor y = trainkit::data::random_crop(x, p, gen);
  REQUIRE(y.sizes() == x.sizes());
  // the documented draw: one [B, 2] randint in [0, 2p] (top, left)
  auto same = generator(42);
  const at::Tensor offsets = torch::randint(0, 2 * p + 1, {b, 2}, same, torch::TensorOptions().dtype(torch::kInt64));
  const auto xa = x.accessor<uint8_t, 4>();
  const auto ya = y.accessor<uint8_t, 4>();
  int64_t wrong = 0;
  for (int64_t s = 0; s < b; ++s) {
    const int64_t top = offsets[s][0].item<int64_t>();
    const int64_t left = offsets[s][1].item<int64_t>();
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t i = 0; i < h; ++i) {
        for (int64_t j = 0; j < w; ++j) {
          // pixel (i, j) of the crop is pixel (i + top - p, j + left - p) of the image, 0 outside it
          const int64_t si = i + top - p, sj = j + left - p;
          const int expected = (si >= 0 && si < h && sj >= 0 && sj < w) ? xa[s][ch][si][sj] : 0;
          wrong += ya[s][ch][i][j] != expected;
        }
      }
    }
  }
  CHECK(wrong == 0);
  SECTION("[B, H, W], padding 0, and every offset in [0, 2p] is drawn") {
    auto g1 = generator(5);
    auto g2 = generator(5);
    const at::Tensor gray = x.select(1, 0).contiguous();
    CHECK(torch::equal(trainkit::data::random_crop(gray, p, g1),
                       trainkit::data::random_crop(gray.unsqueeze(1), p, g2).squeeze(1)));
    CHECK(torch::equal(trainkit::data::random_crop(x, 0, g1), x));
    auto g3 = generator(6);
    const at::Tensor ones = torch::ones({400, 1, 3, 3}, torch::kUInt8);
    // the number of zero rows on top tells the offset: top = p - zero rows when top <= p
    const at::Tensor cropped = trainkit::data::random_crop(ones, 1, g3);
    const at::Tensor corner = cropped.select(1, 0).select(1, 0).select(1, 0);  // pixel (0, 0)
    CHECK(corner.sum().item<int64_t>() > 100);   // offset (>=1, >=1): inside the image
    CHECK(corner.sum().item<int64_t>() < 300);   // offset with a 0: padding
  }
}

TEST_CASE("random_horizontal_flip mirrors the samples whose draw is below p", "[data][transforms]") {
  const at::Tensor x = images_u8({8, 2, 3, 4}, 4);
  auto gen = generator(9);
  const at::Tensor y = trainkit::data::random_horizontal_flip(x, 0.5, gen);
  auto same = generator(9);
  const at::Tensor u = torch::rand({8}, same, torch::TensorOptions().dtype(torch::kFloat64));
  int flipped = 0;
  for (int64_t s = 0; s < 8; ++s) {
    const bool flip = u[s].item<double>() < 0.5;
    flipped += flip;
    at::Tensor expected = x[s].clone();
    if (flip) {
      for (int64_t j = 0; j < 4; ++j) {
        expected.select(2, j).copy_(x[s].select(2, 3 - j));
      }
    }
    CHECK(torch::equal(y[s], expected));
  }
  CHECK(flipped > 0);
  CHECK(flipped < 8);
  CHECK(torch::equal(trainkit::data::random_horizontal_flip(x, 0.0, gen), x));
  CHECK(torch::equal(trainkit::data::random_horizontal_flip(x, 1.0, gen), x.flip({-1})));
}

TEST_CASE("random_erasing erases torchvision's RandomErasing rectangles from the same seed", "[data][transforms]") {
  // The golden boxes are torchvision 0.29's RandomErasing(p, scale, ratio, value=0) applied to all-ones
  // images one after another after torch.manual_seed(seed); (0, 0, 0, 0): the sample was left as it was.
  for (const char* name : {"fmnist_defaults", "wide_large_scale", "tiny"}) {
    INFO(name);
    const auto& table = *trainkit::test::golden("data.toml")[std::string("random_erasing_") + name].as_table();
    const auto shape = trainkit::test::values_of<int64_t>(*table.get("shape"));
    const auto scale = trainkit::test::values_of<double>(*table.get("scale"));
    const auto ratio = trainkit::test::values_of<double>(*table.get("ratio"));
    const auto boxes = trainkit::test::values_of<int64_t>(*table.get("boxes"));
    const int64_t b = shape[0], h = shape[2], w = shape[3];
    REQUIRE(static_cast<int64_t>(boxes.size()) == 4 * b);
    auto gen = generator(static_cast<uint64_t>(table["seed"].value<int64_t>().value()));
    const at::Tensor y = trainkit::data::random_erasing(torch::ones(shape), table["p"].value<double>().value(),
                                                        {scale[0], scale[1]}, {ratio[0], ratio[1]}, 0.0, gen);
    const at::Tensor expected = torch::ones(shape);
    int64_t erased = 0;
    for (int64_t s = 0; s < b; ++s) {
      const auto k = static_cast<size_t>(4 * s);
      expected[s].slice(1, boxes[k], boxes[k] + boxes[k + 2]).slice(2, boxes[k + 1], boxes[k + 1] + boxes[k + 3]).zero_();
      erased += boxes[k + 2] > 0;
    }
    CHECK(erased > 0);
    CHECK(erased <= b);
    CHECK(torch::equal(y, expected));
    CHECK(h > 0);
    CHECK(w > 0);
  }
  SECTION("any dtype and rank, the value in every channel, and the same draws for [B, H, W]") {
    const at::Tensor x = images_u8({16, 3, 9, 9}, 12);
    auto g1 = generator(21);
    const at::Tensor y = trainkit::data::random_erasing(x, 1.0, {0.1, 0.3}, {0.5, 2.0}, 7.0, g1);
    CHECK(y.scalar_type() == torch::kUInt8);
    // The draws do not depend on the pixels: the rectangles erased from all-ones images with the same seed,
    // in every channel, hold 7 and the rest is x.
    auto same = generator(21);
    const at::Tensor mask =
        trainkit::data::random_erasing(torch::ones({16, 3, 9, 9}), 1.0, {0.1, 0.3}, {0.5, 2.0}, 0.0, same).eq(0);
    CHECK(mask.sum().item<int64_t>() > 0);
    CHECK(torch::equal(mask.all(1), mask.any(1)));
    CHECK(torch::equal(y, torch::where(mask, torch::full_like(x, 7), x)));
    auto g2 = generator(21);
    auto g3 = generator(21);
    const at::Tensor gray = x.select(1, 0).contiguous();
    CHECK(torch::equal(trainkit::data::random_erasing(gray, 1.0, {0.1, 0.3}, {0.5, 2.0}, 7.0, g2),
                       trainkit::data::random_erasing(gray.unsqueeze(1), 1.0, {0.1, 0.3}, {0.5, 2.0}, 7.0, g3).squeeze(1)));
  }
  SECTION("p = 0 erases nothing; rectangles that never fit leave the image as it is") {
    const at::Tensor x = torch::rand({8, 1, 6, 6});
    auto gen = generator(1);
    CHECK(torch::equal(trainkit::data::random_erasing(x, 0.0, {0.02, 0.33}, {0.3, 3.3}, 0.0, gen), x));
    // scale 1 and ratio 1: every try is the whole image, which torchvision's 10 tries reject
    CHECK(torch::equal(trainkit::data::random_erasing(x, 1.0, {1.0, 1.0}, {1.0, 1.0}, 0.0, gen), x));
  }
  SECTION("bad arguments") {
    const at::Tensor x = torch::rand({2, 1, 4, 4});
    auto gen = generator(1);
    CHECK_THROWS_MATCHES(trainkit::data::random_erasing(x, 1.5, {0.02, 0.33}, {0.3, 3.3}, 0.0, gen),
                         std::invalid_argument, WhatContains("p: 1.5"));
    CHECK_THROWS_MATCHES(trainkit::data::random_erasing(x, 0.5, {0.4, 0.2}, {0.3, 3.3}, 0.0, gen),
                         std::invalid_argument, WhatContains("scale: (0.4, 0.2)"));
    CHECK_THROWS_MATCHES(trainkit::data::random_erasing(x, 0.5, {0.02, 0.33}, {0.0, 3.3}, 0.0, gen),
                         std::invalid_argument, WhatContains("ratio: (0, 3.3)"));
  }
}

TEST_CASE("crop flip and erasing return their input's memory format", "[data][transforms]") {
  // A 1-channel NCHW batch's strides also count as channels-last-contiguous; a gather of its permuted copy
  // came out with NHWC strides (784, 1, 28, 1), which made every convolution of the model run channels-last
  // although the model was NCHW, and an op after it could switch the whole network back.
  const auto check_format = [](const at::Tensor& x, at::MemoryFormat format) {
    auto gen = generator(17);
    CHECK(trainkit::data::random_crop(x, 2, gen).suggest_memory_format() == format);
    CHECK(trainkit::data::random_horizontal_flip(x, 0.5, gen).suggest_memory_format() == format);
    CHECK(trainkit::data::random_erasing(x, 0.5, {0.02, 0.33}, {0.3, 3.3}, 0.0, gen).suggest_memory_format() == format);
    CHECK(trainkit::data::normalize(x, {0.5}, {0.25}).suggest_memory_format() == format);
  };
  const at::Tensor gray = torch::rand({16, 1, 28, 28});
  REQUIRE(gray.suggest_memory_format() == at::MemoryFormat::Contiguous);
  check_format(gray, at::MemoryFormat::Contiguous);
  check_format(gray.to(gray.options(), false, false, at::MemoryFormat::ChannelsLast), at::MemoryFormat::ChannelsLast);
  check_format(torch::rand({8, 3, 9, 9}), at::MemoryFormat::Contiguous);
  check_format(torch::rand({8, 3, 9, 9}).contiguous(at::MemoryFormat::ChannelsLast), at::MemoryFormat::ChannelsLast);
}

TEST_CASE("DeviceSource on the CPU: pass-through and reproducible augmentation", "[data][transforms][device]") {
  std::vector<Batch> batches;
  for (uint64_t i = 0; i < 5; ++i) {
    batches.emplace_back(images_u8({4, 1, 6, 6}, 100 + i), torch::arange(4, torch::kInt64) + 4 * i);
  }
  auto source = std::make_shared<trainkit::data::FunctionSource>(trainkit::data::from_batches(batches));
  SECTION("without transforms the batches pass through") {
    DeviceSource plain(source, torch::kCPU);
    const auto out = read_epoch(plain, 0);
    REQUIRE(out.size() == 5);
    for (size_t i = 0; i < 5; ++i) {
      CHECK(torch::equal(out[i].input(), batches[i].input()));
      CHECK(torch::equal(out[i].target(), batches[i].target()));
    }
    CHECK(plain.num_batches() == 5);
  }
  SECTION("normalize only equals data::normalize") {
    DeviceSource normalized(source, torch::kCPU, DeviceTransformOptions().normalize({0.2860}, {0.3530}));
    const auto out = read_epoch(normalized, 0);
    CHECK(torch::equal(out[2].input(), trainkit::data::normalize(batches[2].input(), {0.2860}, {0.3530})));
    CHECK(torch::equal(out[2].target(), batches[2].target()));
  }
  SECTION("augmentation depends on (seed, epoch, batch) only, and resumes") {
    const auto options = DeviceTransformOptions().crop_padding(2).horizontal_flip(true).normalize({0.5}, {0.5}).seed(3);
    DeviceSource a(source, torch::kCPU, options);
    DeviceSource b(source, torch::kCPU, options);
    const auto e0 = read_epoch(a, 0);
    const auto again = read_epoch(b, 0);
    const auto e1 = read_epoch(a, 1);
    REQUIRE(e0.size() == 5);
    for (size_t i = 0; i < 5; ++i) {
      CHECK(e0[i].input().scalar_type() == torch::kFloat);
      CHECK(torch::equal(e0[i].input(), again[i].input()));
    }
    CHECK_FALSE(torch::equal(e0[0].input(), e1[0].input()));  // same images, another epoch's draws
    DeviceSource other_seed(source, torch::kCPU, DeviceTransformOptions(options).seed(4));
    CHECK_FALSE(torch::equal(read_epoch(other_seed, 0)[0].input(), e0[0].input()));
    // resumed at batch 3 of epoch 1
    a.set_epoch(1);
    a.skip(3);
    const auto resumed = a.next();
    REQUIRE(resumed);
    CHECK(torch::equal(resumed->input(), e1[3].input()));
  }
  SECTION("crop, flip, normalize and erasing equal the standalone transforms, in that order, on the batch's generator") {
    // Batch b of epoch e draws from a CPU generator seeded with derive_seed(seed, kDeviceBatch, e, b): the crop
    // offsets first, then the flip draws, then the erasing draws. Non-default probabilities and ranges show
    // that they are passed on.
    const auto options = DeviceTransformOptions()
                             .crop_padding(2)
                             .horizontal_flip(true)
                             .flip_probability(0.3)
                             .normalize({0.4}, {0.25})
                             .erasing_probability(0.7)
                             .erasing_scale({0.05, 0.4})
                             .erasing_ratio({0.5, 2.0})
                             .erasing_value(-1.5)
                             .seed(9);
    DeviceSource augmented(source, torch::kCPU, options);
    for (const int64_t epoch : {0, 2}) {
      const auto out = read_epoch(augmented, epoch);
      REQUIRE(out.size() == 5);
      for (size_t i = 0; i < 5; ++i) {
        INFO("epoch " << epoch << ", batch " << i);
        auto gen = generator(trainkit::data::detail::derive_seed(
            9, trainkit::data::detail::SeedStream::kDeviceBatch, epoch, static_cast<int64_t>(i)));
        at::Tensor x = trainkit::data::random_crop(batches[i].input(), 2, gen);
        x = trainkit::data::random_horizontal_flip(x, 0.3, gen);
        x = trainkit::data::normalize(x, {0.4}, {0.25});
        x = trainkit::data::random_erasing(x, 0.7, {0.05, 0.4}, {0.5, 2.0}, -1.5, gen);
        CHECK(torch::equal(out[i].input(), x));
        CHECK(torch::equal(out[i].target(), batches[i].target()));
      }
    }
    // The steps do something: without them (normalize only) the images differ.
    DeviceSource normalized(source, torch::kCPU, DeviceTransformOptions().normalize({0.4}, {0.25}).seed(9));
    CHECK_FALSE(torch::equal(read_epoch(normalized, 0)[1].input(), read_epoch(augmented, 0)[1].input()));
  }
  SECTION("the image input is chosen by name; the rest passes through; a custom transform runs last") {
    std::vector<Batch> named;
    for (const auto& b : batches) {
      Batch n;
      n.add_input(b.target(), "ids");
      n.add_input(b.input(), "image");
      n.add_target(b.target());
      named.push_back(n);
    }
    auto named_source = std::make_shared<trainkit::data::FunctionSource>(trainkit::data::from_batches(named));
    int calls = 0;
    DeviceSource source_by_name(named_source, torch::kCPU,
                                DeviceTransformOptions().input_name("image").normalize({0.0}, {1.0}).transform(
                                    [&](Batch b, at::Generator&) {
                                      ++calls;
                                      return b;
                                    }));
    const auto out = read_epoch(source_by_name, 0);
    CHECK(calls == 5);
    CHECK(torch::equal(out[1].input("ids"), batches[1].target()));
    CHECK(torch::allclose(out[1].input("image"), batches[1].input().to(torch::kFloat) / 255));
    DeviceSource missing(named_source, torch::kCPU, DeviceTransformOptions().input_name("pixels").crop_padding(1));
    missing.set_epoch(0);
    CHECK_THROWS_MATCHES(missing.next(), std::out_of_range, WhatContains("pixels"));
  }
  SECTION("bad options") {
    CHECK_THROWS_MATCHES(DeviceSource(source, torch::kCPU, DeviceTransformOptions().crop_padding(-1)),
                         std::invalid_argument, WhatContains("crop_padding: -1"));
    CHECK_THROWS_MATCHES(DeviceSource(source, torch::kCPU, DeviceTransformOptions().normalize({0.5}, {0.5, 0.5})),
                         std::invalid_argument, WhatContains("1 mean values but 2 std"));
    CHECK_THROWS_MATCHES(DeviceSource(source, torch::kCPU, DeviceTransformOptions().erasing_probability(2)),
                         std::invalid_argument, WhatContains("erasing_probability: 2"));
    CHECK_THROWS_MATCHES(DeviceSource(source, torch::kCPU, DeviceTransformOptions().erasing_ratio({2.0, 1.0})),
                         std::invalid_argument, WhatContains("erasing_ratio: (2, 1)"));
  }
}

TEST_CASE("DeviceSource on CUDA applies the CPU's augmentation", "[data][transforms][device][cuda]") {
  if (!torch::cuda::is_available()) {
    TRAINKIT_SKIP("no CUDA device: the GPU side of the comparison needs a GPU");
  }
  std::vector<Batch> batches;
  for (uint64_t i = 0; i < 3; ++i) {
    batches.emplace_back(images_u8({4, 3, 8, 8}, 200 + i).pin_memory(), torch::arange(4, torch::kInt64).pin_memory());
  }
  auto source = std::make_shared<trainkit::data::FunctionSource>(trainkit::data::from_batches(batches));
  const auto options = DeviceTransformOptions().crop_padding(2).horizontal_flip(true).normalize(
      {0.1, 0.2, 0.3}, {0.5, 0.5, 0.5});
  DeviceSource gpu(source, torch::kCUDA, options);
  DeviceSource cpu(source, torch::kCPU, options);
  const auto g = read_epoch(gpu, 0);
  const auto c = read_epoch(cpu, 0);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(g[i].input().is_cuda());
    CHECK(torch::allclose(g[i].input().cpu(), c[i].input(), 1e-6, 1e-6));
  }
}
