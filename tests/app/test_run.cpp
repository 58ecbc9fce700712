// build_run's data pipeline: the samples stay on the host and each batch goes to the training device
// through a DeviceSource; normalizing there gives the host-normalized batches, worker threads give the
// batches of the in-thread loader, augmentation is reproducible per (seed, epoch, batch), and a bad
// metric/monitor pair is a config error; data.dataset = "cifar10" reads CIFAR-10's binary batches.
#include <torch/torch.h>

#include "data/cifar_fixture.h"
#include "data/read_batches.h"
#include "support.h"
#include "trainkit/app/config.h"
#include "trainkit/app/run.h"
#include "trainkit/data/cifar.h"
#include "trainkit/data/idx.h"

using namespace trainkit;
using trainkit::test::read_epoch;
using trainkit::test::WhatContains;

namespace {

app::Run small_run(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"data.limit_train=600", "data.limit_test=100", "data.val_size=100",
                                  "train.batch_size=50", "model.name=\"mlp\"", "model.hidden=16"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return app::build_run(app::parse_config("", "test.toml", all), "test.toml");
}


}  // namespace

TEST_CASE("build_run: device normalization, workers and augmentation", "[app][run][data]") {
  app::Run plain = small_run({});
  CHECK(plain.device == torch::Device(torch::kCPU));  // train.device = "auto" without CUDA
  CHECK(plain.train->num_batches() == 10);
  const auto reference = read_epoch(*plain.train, 1);
  SECTION("uint8 on the host, normalized on the device: the same batches") {
    app::Run run = small_run({"data.normalize_on_device=true"});
    CHECK(run.train_split.images.scalar_type() == torch::kByte);
    const auto batches = read_epoch(*run.train, 1);
    REQUIRE(batches.size() == reference.size());
    for (size_t i = 0; i < batches.size(); ++i) {
      INFO("batch " << i);
      CHECK(batches[i].input().scalar_type() == torch::kFloat);
      CHECK(torch::allclose(batches[i].input(), reference[i].input(), 0.0, 1e-6));
      CHECK(torch::equal(batches[i].target(), reference[i].target()));
    }
  }
  SECTION("worker threads: exactly the in-thread batches") {
    app::Run run = small_run({"data.workers=2"});
    const auto batches = read_epoch(*run.train, 1);
    REQUIRE(batches.size() == reference.size());
    for (size_t i = 0; i < batches.size(); ++i) {
      CHECK(torch::equal(batches[i].input(), reference[i].input()));
      CHECK(torch::equal(batches[i].target(), reference[i].target()));
    }
  }
  SECTION("augmentation changes the batches, the same way each time") {
    app::Run a = small_run({"data.crop_padding=2", "data.horizontal_flip=true"});
    app::Run b = small_run({"data.crop_padding=2", "data.horizontal_flip=true"});
    const auto first = read_epoch(*a.train, 1);
    const auto second = read_epoch(*b.train, 1);
    CHECK_FALSE(torch::equal(first[0].input(), reference[0].input()));
    CHECK(torch::equal(first[3].input(), second[3].input()));
    CHECK(torch::equal(first[3].target(), reference[3].target()));
    b.train->set_epoch(1);
    b.train->skip(3);
    CHECK(torch::equal(b.train->next()->input(), first[3].input()));  // resumed mid-epoch
    const auto val = read_epoch(*a.val, 0);  // evaluation is never augmented
    CHECK(torch::equal(val[0].input(), read_epoch(*plain.val, 0)[0].input()));
  }
}

TEST_CASE("build_run: metrics and the monitored value must agree", "[app][run]") {
  CHECK_THROWS_MATCHES(small_run({"train.monitor=\"val/mse\""}), app::ConfigError,
                       WhatContains("train.monitor = \"val/mse\" but train.metrics does not measure \"mse\""));
  CHECK_THROWS_MATCHES(small_run({"train.metrics=[\"accuracy\", \"f1\"]"}), app::ConfigError,
                       WhatContains("unknown metric \"f1\""));
  app::Run run = small_run({"train.metrics=[\"accuracy\", \"top3_accuracy\"]", "train.monitor=\"val/top3_accuracy\""});
  REQUIRE(run.trainer->metrics().size() == 2);
  CHECK(run.trainer->metrics()[1]->name() == "top3_accuracy");
}

TEST_CASE("build_run: data.dataset = \"cifar10\" trains on CIFAR-10's binary batches", "[app][run][data][cifar]") {
  trainkit::test::TempDir dir("run-cifar");
  for (int i = 1; i <= 5; ++i) {
    trainkit::test::write_cifar_batch(dir.str("data_batch_" + std::to_string(i) + ".bin"), 8 * (i - 1), 8);
  }
  trainkit::test::write_cifar_batch(dir.str("test_batch.bin"), 100, 6);
  const auto cifar_run = [&](const std::vector<std::string>& overrides) {
    std::vector<std::string> all = {"data.dataset=\"cifar10\"", "data.dir=\"" + dir.str() + "\"",
                                    "data.val_size=10", "train.batch_size=10"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    return app::build_run(app::parse_config("", "test.toml", all), "test.toml");
  };
  app::Run run = cifar_run({"model.name=\"resnet\"", "model.depth=8"});
  // 40 training records: the first 30 train, the last 10 validate; the test file's 6 records.
  REQUIRE(run.train_split.images.sizes() == at::IntArrayRef({30, 3, 32, 32}));
  REQUIRE(run.val_split.images.size(0) == 10);
  REQUIRE(run.test_split.images.size(0) == 6);
  CHECK(run.val_split.labels[0].item<int64_t>() == (30 * 3) % 10);
  // Normalized per channel with CIFAR-10's own mean and std.
  for (int64_t c = 0; c < 3; ++c) {
    const double expected =
        (trainkit::test::cifar_pixel(5, c, 7, 11) / 255.0 - data::kCifar10Mean[c]) / data::kCifar10Std[c];
    CHECK(run.train_split.images[5][c][7][11].item<double>() == Approx(expected).epsilon(1e-6));
  }
  const at::Tensor logits = run.model->forward(run.train_split.images.narrow(0, 0, 4));
  CHECK(logits.sizes() == at::IntArrayRef({4, 10}));

  SECTION("normalized on the device: the same batches") {
    app::Run host = cifar_run({"model.name=\"mlp\"", "model.hidden=8"});
    app::Run device = cifar_run({"model.name=\"mlp\"", "model.hidden=8", "data.normalize_on_device=true"});
    CHECK(device.train_split.images.scalar_type() == torch::kByte);
    const auto a = read_epoch(*host.train, 0);
    const auto b = read_epoch(*device.train, 0);
    REQUIRE(a.size() == 3);
    REQUIRE(b.size() == 3);
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(torch::allclose(a[i].input(), b[i].input(), 0.0, 1e-5));
    }
    CHECK(host.model->forward(a[0].input()).sizes() == at::IntArrayRef({10, 10}));  // 3x32x32 inputs
  }
  SECTION("the CNN sizes itself to 3x32x32 images") {
    app::Run cnn = cifar_run({"model.name=\"cnn\"", "model.channels=[4, 8]", "model.hidden=8"});
    CHECK(cnn.model->forward(cnn.val_split.images).sizes() == at::IntArrayRef({10, 10}));
  }
  SECTION("a missing batch file is named") {
    std::filesystem::remove(dir.path() / "data_batch_3.bin");
    CHECK_THROWS_MATCHES(cifar_run({}), data::DataError, WhatContains("data_batch_3.bin"));
  }
}
