// build_run's data pipeline: the samples stay on the host and each batch goes to the training device
// through a DeviceSource; normalizing there gives the host-normalized batches, worker threads give the
// batches of the in-thread loader, augmentation is reproducible per (seed, epoch, batch), and a bad
// metric/monitor pair is a config error; data.dataset = "cifar10" reads CIFAR-10's binary batches. A run
// whose loss diverges to NaN still writes metrics.jsonl and summary.json as valid JSON (NaN as null), which
// nlohmann-json, Python's json module and jq all read. choose_device puts rank r of a machine on cuda:r.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "data/cifar_fixture.h"
#include "data/read_batches.h"
#include "support.h"
#include "trainkit/app/config.h"
#include "trainkit/app/jobs.h"
#include "trainkit/app/run.h"
#include "trainkit/data/cifar.h"
#include "trainkit/data/device_source.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/parallel_loader.h"
#include "trainkit/optim/adam.h"
#include "trainkit/optim/param_groups.h"
#include "trainkit/optim/sgd.h"

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

// `trainkit train` on 300 images with plain SGD at lr = 1e38: the first step's update is ~1e36 per weight,
// so the second step's activations overflow float32 and the loss is NaN from then on (PyTorch's SGD on the
// same MLP: NaN from step 2 for every seed tried). The default Adam would not do: its step is bounded by the
// LR, and at lr = 1e6 the loss stays huge but finite. Returns the run directory.
std::string diverged_run(const trainkit::test::TempDir& tmp) {
  const std::string config = tmp.str("diverge.toml");
  std::ofstream(config) << "[data]\nval_size = 100\nlimit_train = 400\nlimit_test = 100\n"
                           "[model]\nname = \"mlp\"\nhidden = 16\n"
                           "[optimizer]\nname = \"sgd\"\nlr = 1e38\n"
                           "[train]\nepochs = 1\nbatch_size = 50\n"
                           "[log]\nevery_steps = 2\nprogress = \"lines\"\n";
  app::TrainJobOptions options;
  options.config_path = config;
  options.out_dir = tmp.str("run");
  const app::TrainJobResult result = app::run_train_job(options);
  REQUIRE(result.steps == 6);
  REQUIRE(std::isnan(result.test_loss));  // the run did diverge: what follows tests NaN, not a finite loss
  return options.out_dir;
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
    // The key takes effect: the training batches come from a ParallelLoader with two workers.
    const auto* device_source = dynamic_cast<const data::DeviceSource*>(run.train.get());
    REQUIRE(device_source != nullptr);
    const auto* loader = dynamic_cast<const data::ParallelLoader*>(&device_source->source());
    REQUIRE(loader != nullptr);
    CHECK(loader->options().num_workers() == 2);
    const auto* plain_source = dynamic_cast<const data::DeviceSource*>(plain.train.get());
    REQUIRE(plain_source != nullptr);
    CHECK(dynamic_cast<const data::ParallelLoader*>(&plain_source->source()) == nullptr);
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

TEST_CASE("build_run: train.label_smoothing smooths the training loss and validation reports plain cross-entropy",
          "[app][run][label_smoothing]") {
  CHECK_FALSE(static_cast<bool>(small_run({}).loss));  // the Trainer's plain cross-entropy
  app::Run run = small_run({"train.label_smoothing=0.3"});
  REQUIRE(static_cast<bool>(run.loss));
  run.model->eval();
  double plain = 0, smoothed = 0;
  int64_t samples = 0;
  {
    torch::NoGradGuard no_grad;
    const auto smoothing = torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(0.3);
    run.val->set_epoch(0);
    while (auto b = run.val->next()) {
      const at::Tensor out = run.forward(*b);
      const auto n = static_cast<double>(b->size());
      plain += torch::nn::functional::cross_entropy(out, b->target()).item<double>() * n;
      smoothed += torch::nn::functional::cross_entropy(out, b->target(), smoothing).item<double>() * n;
      CHECK(run.loss(out, *b).item<double>() ==
            Approx(torch::nn::functional::cross_entropy(out, b->target(), smoothing).item<double>()).epsilon(1e-6));
      samples += b->size();
    }
  }
  REQUIRE(samples == 100);
  plain /= static_cast<double>(samples);
  smoothed /= static_cast<double>(samples);
  REQUIRE(std::abs(plain - smoothed) > 1e-3);
  CHECK(run.trainer->evaluate(*run.val).loss == Approx(plain).epsilon(1e-5));
}

TEST_CASE("build_run: model.channels_last is refused for a TorchScript model", "[app][run]") {
  // Checked before the file is read: the message names the key, whatever the file.
  CHECK_THROWS_MATCHES(small_run({"model.name=\"torchscript\"", "model.torchscript=\"any.pt\"",
                                  "model.channels_last=true"}),
                       app::ConfigError,
                       WhatContains("model.channels_last applies to the built-in image models, not to model.name = "
                                    "\"torchscript\""));
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
  const at::Tensor logits = run.forward(data::Batch(run.train_split.images.narrow(0, 0, 4), run.train_split.labels.narrow(0, 0, 4)));
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
    CHECK(host.forward(a[0]).sizes() == at::IntArrayRef({10, 10}));  // 3x32x32 inputs
  }
  SECTION("the CNN sizes itself to 3x32x32 images") {
    app::Run cnn = cifar_run({"model.name=\"cnn\"", "model.channels=[4, 8]", "model.hidden=8"});
    CHECK(cnn.forward(data::Batch(cnn.val_split.images, cnn.val_split.labels)).sizes() == at::IntArrayRef({10, 10}));
  }
  SECTION("a missing batch file is named") {
    std::filesystem::remove(dir.path() / "data_batch_3.bin");
    CHECK_THROWS_MATCHES(cifar_run({}), data::DataError, WhatContains("data_batch_3.bin"));
  }
}

TEST_CASE("A diverged run writes metrics.jsonl and summary.json as valid JSON, NaN as null", "[app][run][json]") {
  trainkit::test::TempDir tmp("run-diverged");
  const std::string run = diverged_run(tmp);
  std::ifstream jsonl(run + "/metrics.jsonl");
  int64_t rows = 0;
  int64_t null_losses = 0;
  for (std::string line; std::getline(jsonl, line);) {
    INFO(line);
    nlohmann::json row;
    REQUIRE_NOTHROW(row = nlohmann::json::parse(line));  // `nan` is not JSON
    ++rows;
    null_losses += row.contains("loss") && row["loss"].is_null() ? 1 : 0;
  }
  CHECK(rows >= 4);           // train rows every 2 steps, the epoch row, the test row
  CHECK(null_losses >= 1);  // the epoch's mean loss is NaN
  const std::string text = trainkit::test::read_text(run + "/summary.json");
  INFO(text);
  nlohmann::json summary;
  REQUIRE_NOTHROW(summary = nlohmann::json::parse(text));
  CHECK(summary["test_loss"].is_null());
  CHECK(summary["steps"] == 6);
  CHECK(summary["finished"] == true);
  CHECK(summary["test_accuracy"].is_number());
  CHECK(summary["step_times"]["steps"] == 6);
  CHECK(summary["epoch_step_times"].size() == 1);
}

// Run by the ctest `json_files_read_by_python_and_jq`, which sets TRAINKIT_PYTHON to the project's venv.
TEST_CASE("Python's json module and jq read a diverged run's metrics.jsonl and summary.json", "[.json-python-jq]") {
  const char* python = std::getenv("TRAINKIT_PYTHON");
  if (python == nullptr || *python == '\0' || !std::filesystem::exists(python)) {
    const std::string got = python ? python : "nothing";
    TRAINKIT_SKIP("TRAINKIT_PYTHON names no Python (got " << got << "); run ctest -R json_files_read_by_python_and_jq");
  }
  if (std::system("command -v jq > /dev/null 2>&1") != 0) {
    TRAINKIT_SKIP("jq is not on PATH (Debian: jq)");
  }
  trainkit::test::TempDir tmp("run-diverged-readers");
  const std::string run = diverged_run(tmp);
  const std::string jsonl = run + "/metrics.jsonl";
  const std::string summary = run + "/summary.json";
  const std::string log = tmp.str("readers.log");
  const auto succeeds = [&log](const std::string& command) {
    const int code = std::system((command + " > \"" + log + "\" 2>&1").c_str());
    INFO(command << "\n" << trainkit::test::read_text(log));
    CHECK(code == 0);
  };
  // Strict JSON: parse_constant rejects the NaN and Infinity that Python's json module accepts by default.
  const std::string script = tmp.str("read_json.py");
  std::ofstream(script) << "import json, sys\n"
                           "def reject(name):\n"
                           "    raise ValueError('not JSON: ' + name)\n"
                           "rows = [json.loads(l, parse_constant=reject) for l in open(sys.argv[1]) if l.strip()]\n"
                           "summary = json.load(open(sys.argv[2]), parse_constant=reject)\n"
                           "assert summary['test_loss'] is None, summary['test_loss']\n"
                           "assert any('loss' in r and r['loss'] is None for r in rows), rows\n";
  succeeds("\"" + std::string(python) + "\" \"" + script + "\" \"" + jsonl + "\" \"" + summary + "\"");
  succeeds("jq -e '.test_loss == null and .steps == 6' \"" + summary + "\"");
  succeeds("jq -e -s 'length >= 4 and any(.[]; has(\"loss\") and .loss == null)' \"" + jsonl + "\"");
}

TEST_CASE("choose_device: one GPU per rank from LOCAL_RANK, errors naming both numbers", "[app][run][device]") {
  const auto choose = [](const std::string& setting, int64_t world, int64_t local_rank, int64_t gpus) {
    return app::choose_device(setting, world, local_rank, gpus, "run.toml");
  };
  const torch::Device cpu(torch::kCPU);
  SECTION("cpu, and auto without CUDA") {
    CHECK(choose("cpu", 1, 0, 8) == cpu);
    CHECK(choose("cpu", 4, 3, 0) == cpu);
    CHECK(choose("auto", 1, 0, 0) == cpu);
    CHECK(choose("auto", 2, 1, 0) == cpu);
  }
  SECTION("cuda and auto: rank r of a machine on cuda:r, a single process on cuda:0") {
    for (const std::string setting : {"cuda", "auto"}) {
      INFO(setting);
      CHECK(choose(setting, 1, 0, 1) == torch::Device(torch::kCUDA, 0));
      CHECK(choose(setting, 1, 0, 8) == torch::Device(torch::kCUDA, 0));
      CHECK(choose(setting, 2, 0, 2) == torch::Device(torch::kCUDA, 0));
      CHECK(choose(setting, 2, 1, 2) == torch::Device(torch::kCUDA, 1));
      for (int64_t r = 0; r < 8; ++r) {
        CHECK(choose(setting, 16, r, 8) == torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(r)));
      }
      CHECK_THROWS_MATCHES(choose(setting, 4, 2, 2), app::ConfigError,
                           WhatContains("LOCAL_RANK is 2 and this machine has 2 CUDA devices"));
      CHECK_THROWS_MATCHES(choose(setting, 2, 1, 1), app::ConfigError,
                           WhatContains("LOCAL_RANK is 1 and this machine has 1 CUDA device "));
    }
    CHECK_THROWS_MATCHES(choose("cuda", 1, 0, 0), app::ConfigError,
                         WhatContains("run.toml: train.device = \"cuda\" but no CUDA device is available"));
  }
  SECTION("cuda:<index> for a single process") {
    CHECK(choose("cuda:1", 1, 0, 2) == torch::Device(torch::kCUDA, 1));
    CHECK(choose("cuda:7", 1, 0, 8) == torch::Device(torch::kCUDA, 7));
    CHECK_THROWS_MATCHES(choose("cuda:2", 1, 0, 2), app::ConfigError,
                         WhatContains("\"cuda:2\" but this machine has 2 CUDA devices (cuda:0 .. cuda:1)"));
    CHECK_THROWS_MATCHES(choose("cuda:0", 2, 0, 2), app::ConfigError, WhatContains("would put all 2 ranks on one GPU"));
    CHECK_THROWS_MATCHES(choose("cuda:0", 1, 0, 0), app::ConfigError, WhatContains("no CUDA device is available"));
  }
  SECTION("the config accepts cuda:<index> and nothing like it") {
    CHECK(app::parse_config("[train]\ndevice = \"cuda:3\"\n", "c.toml").train.device == "cuda:3");
    for (const std::string bad : {"cuda:", "cuda:x", "cuda:-1", "gpu", "cuda:1:2"}) {
      INFO(bad);
      CHECK_THROWS_MATCHES(app::parse_config("[train]\ndevice = \"" + bad + "\"\n", "c.toml"), app::ConfigError,
                           WhatContains("\"cuda:<index>\""));
    }
  }
}

TEST_CASE("optimizer.layer_decay: one group per layer and decay, LR scaled by depth as timm's", "[app][run][layer_decay]") {
  const auto config = [](std::vector<std::string> more) {
    std::vector<std::string> all = {"data.limit_train=600", "data.limit_test=100", "data.val_size=100",
                                    "model.channels=[4, 8]", "model.hidden=16", "optimizer.name=\"adamw\"",
                                    "optimizer.lr=0.01", "optimizer.weight_decay=0.05"};
    all.insert(all.end(), more.begin(), more.end());
    return app::parse_config("", "test.toml", all);
  };
  app::Run run = app::build_run(config({"optimizer.layer_decay=0.5"}), "test.toml");
  // The CNN's children: conv 0 + norm 1, conv 4 + norm 5, linear 10, linear 13 (a norm joins its conv).
  const auto ids = optim::child_layer_ids(*run.model);
  CHECK(ids.at("0.weight") == 0);
  CHECK(ids.at("1.weight") == 0);
  CHECK(ids.at("1.bias") == 0);
  CHECK(ids.at("4.weight") == 1);
  CHECK(ids.at("5.bias") == 1);
  CHECK(ids.at("10.weight") == 2);
  CHECK(ids.at("13.bias") == 3);
  CHECK(ids.size() == run.model->parameters().size());

  // Every parameter once, in a group whose LR is 0.01 x 0.5^(3 - layer) and whose weight decay is 0 for
  // 1-D tensors, 0.05 otherwise (timm's param_groups_layer_decay).
  std::map<const void*, std::string> name_of;
  for (const auto& p : run.model->named_parameters()) {
    name_of[p.value().unsafeGetTensorImpl()] = p.key();
  }
  size_t seen = 0;
  std::set<double> lrs;
  for (const auto& group : run.optimizer->param_groups()) {
    const auto& o = static_cast<const optim::AdamWOptions&>(group.options());
    for (const auto& p : group.params()) {
      const std::string& name = name_of.at(p.unsafeGetTensorImpl());
      INFO(name);
      CHECK(o.lr() == Approx(0.01 * std::pow(0.5, 3 - ids.at(name))).epsilon(1e-12));
      CHECK(o.weight_decay() == (p.dim() <= 1 ? 0.0 : 0.05));
      ++seen;
    }
    lrs.insert(o.lr());
  }
  CHECK(seen == run.model->parameters().size());
  CHECK(lrs.size() == 4);
  // The effective config records it.
  const ArgTable effective = optim::optimizer_args(config({"optimizer.layer_decay=0.5"}).optimizer);
  CHECK(find_arg(effective, "layer_decay")->to_string() == "0.5");

  // Off by default: one group at the optimizer's LR.
  CHECK(app::build_run(config({}), "test.toml").optimizer->param_groups().size() == 1);
  // Refused: out of range, and with a scheduler that sets every group to one max_lr.
  CHECK_THROWS_MATCHES(config({"optimizer.layer_decay=1.5"}), app::ConfigError,
                       WhatContains("optimizer.layer_decay: expected a number in [0, 1], got 1.5"));
  CHECK_THROWS_MATCHES(
      app::build_run(config({"optimizer.layer_decay=0.5", "scheduler.type=\"OneCycleLR\"", "scheduler.max_lr=0.1"}),
                     "test.toml"),
      app::ConfigError, WhatContains("optimizer.layer_decay gives the param groups their own LRs, but scheduler OneCycleLR"));
}

TEST_CASE("optimizer.lr_by_name: the model's parameters chosen by name train at their rules' LRs",
          "[app][run][lr_by_name]") {
  // The CNN's children: conv 0 + norm 1, conv 4 + norm 5, linear 10, linear 13.
  const std::string rules = R"(
[optimizer]
name = "sgd"
lr = 0.01
momentum = 0.9
weight_decay = 0.001
[[optimizer.lr_by_name]]
name = "conv1"
pattern = ["0.*", "1.*"]
lr = 0.05
[[optimizer.lr_by_name]]
pattern = "13.*"
lr = 0.0001
)";
  const std::vector<std::string> small = {"data.limit_train=600", "data.limit_test=100", "data.val_size=100",
                                          "model.channels=[4, 8]", "model.hidden=16"};
  const app::Config parsed = app::parse_config(rules, "test.toml", small);
  app::Run run = app::build_run(parsed, "test.toml");
  std::map<const void*, std::string> name_of;
  for (const auto& p : run.model->named_parameters()) {
    name_of[p.value().unsafeGetTensorImpl()] = p.key();
  }
  REQUIRE(run.optimizer->param_groups().size() == 3);  // conv1, 13.*, the rest
  // One optimizer step on a training batch. The first SGD step moves p by -lr·(grad + weight_decay·p) (its
  // momentum buffer starts as that gradient): the expected values in float64 from the float32 inputs, compared
  // at float32's precision.
  run.train->set_epoch(0);
  const auto batch = run.train->next();
  REQUIRE(batch.has_value());
  run.optimizer->zero_grad();
  run.trainer->backward(*batch);
  std::vector<std::pair<at::Tensor, at::Tensor>> stepped;  // parameter, expected value after the step
  size_t seen = 0;
  for (const auto& group : run.optimizer->param_groups()) {
    const auto& o = static_cast<const optim::SgdOptions&>(group.options());
    for (const auto& p : group.params()) {
      const std::string& name = name_of.at(p.unsafeGetTensorImpl());
      INFO(name);
      const double expected = name.rfind("0.", 0) == 0 || name.rfind("1.", 0) == 0 ? 0.05
                              : name.rfind("13.", 0) == 0                          ? 0.0001
                                                                                   : 0.01;
      CHECK(o.lr() == expected);
      CHECK(o.momentum() == 0.9);
      CHECK(o.weight_decay() == 0.001);
      REQUIRE(p.grad().defined());
      const at::Tensor p64 = p.detach().to(torch::kFloat64);
      stepped.emplace_back(p, p64 - expected * (p.grad().to(torch::kFloat64) + 0.001 * p64));
      ++seen;
    }
  }
  CHECK(seen == run.model->parameters().size());
  run.optimizer->step();
  for (const auto& [p, expected] : stepped) {
    INFO(name_of.at(p.unsafeGetTensorImpl()) << ": largest departure from p - lr·(grad + wd·p) "
                                             << (p.detach().to(torch::kFloat64) - expected).abs().max().item<double>());
    CHECK(torch::allclose(p.detach().to(torch::kFloat64), expected, /*rtol=*/1e-6, /*atol=*/1e-9));
  }
  // The effective config records the rules in a form that parses back to the same groups.
  const ArgTable effective = optim::optimizer_args(parsed.optimizer);
  const std::string recorded = find_arg(effective, "lr_by_name")->to_string();
  CHECK(recorded == R"([{ name = "conv1", pattern = ["0.*", "1.*"], lr = 0.05 }, { name = "13.*", pattern = ["13.*"], lr = 0.0001 }])");
  const app::Config again = app::parse_config("[optimizer]\nname = \"sgd\"\nlr_by_name = " + recorded + "\n", "again.toml");
  REQUIRE(again.optimizer.lr_by_name.size() == 2);
  CHECK(again.optimizer.lr_by_name[1].lr == 0.0001);

  // Refused: a rule that matches nothing (named, with the model's names), together with layer_decay, a
  // rule without an LR, and a scheduler that sets every group to one max_lr.
  CHECK_THROWS_MATCHES(
      app::build_run(app::parse_config(rules + "[[optimizer.lr_by_name]]\nname = \"fc\"\npattern = \"fc.*\"\nlr = 0.1\n",
                                       "test.toml", small),
                     "test.toml"),
      app::ConfigError, WhatContains("test.toml: optimizer.lr_by_name: lr_groups: rule \"fc\" (fc.*) matches no parameter") &&
                            WhatContains("named like 0.weight, 1.weight, 1.bias"));
  CHECK_THROWS_MATCHES(app::parse_config(rules, "test.toml", {"optimizer.layer_decay=0.5"}), app::ConfigError,
                       WhatContains("optimizer.layer_decay and optimizer.lr_by_name both set"));
  CHECK_THROWS_MATCHES(app::parse_config("[optimizer]\n[[optimizer.lr_by_name]]\npattern = \"x\"\n", "test.toml"),
                       app::ConfigError, WhatContains("test.toml: optimizer.lr_by_name[0]: lr is required"));
  CHECK_THROWS_MATCHES(app::parse_config("[optimizer]\nlr_by_name = 3\n", "test.toml"), app::ConfigError,
                       WhatContains("optimizer.lr_by_name: expected a non-empty array of tables"));
  CHECK_THROWS_MATCHES(
      app::build_run(app::parse_config(rules, "test.toml", {"scheduler.type=\"OneCycleLR\"", "scheduler.max_lr=0.1"}),
                     "test.toml"),
      app::ConfigError, WhatContains("optimizer.lr_by_name gives the param groups their own LRs, but scheduler OneCycleLR"));
}

TEST_CASE("train.val_every_steps: trainkit train validates mid-epoch, logs it, and early stopping follows",
          "[app][run][validation]") {
  trainkit::test::TempDir tmp("run-val-steps");
  const std::string config = tmp.str("val.toml");
  // 500 training images in batches of 50: 10 steps per epoch; a point every 4 steps → steps 4, 8 (mid-epoch),
  // 10 (the epoch's end), 12, 16, 20 (end). SGD at lr 1e-30 does not move the weights, so
  // [early_stopping] with patience 2 ends the job at the third point, step 10.
  std::ofstream(config) << "[data]\nval_size = 100\nlimit_train = 600\nlimit_test = 100\n"
                           "[model]\nname = \"mlp\"\nhidden = 16\n"
                           "[optimizer]\nname = \"sgd\"\nlr = 0.05\n"
                           "[train]\nepochs = 2\nbatch_size = 50\nval_every_steps = 4\n"
                           "[log]\nevery_steps = 5\nprogress = \"lines\"\n";
  app::TrainJobOptions options;
  options.config_path = config;
  options.out_dir = tmp.str("run");
  REQUIRE(app::run_train_job(options).steps == 20);
  std::vector<std::string> val_rows;
  std::ifstream csv(tmp.str("run/metrics.csv"));
  for (std::string line; std::getline(csv, line);) {
    if (line.rfind("val,", 0) == 0) val_rows.push_back(line.substr(0, line.find(',', 4)));
  }
  CHECK(val_rows == std::vector<std::string>{"val,4", "val,8", "val,12", "val,16"});

  options.overrides = {"optimizer.lr=1e-30", "early_stopping.enabled=true", "early_stopping.patience=2",
                       "early_stopping.min_delta=1e-6"};
  options.out_dir = tmp.str("stopped");
  CHECK(app::run_train_job(options).steps == 10);

  options.overrides = {"data.val_size=0"};
  options.out_dir = tmp.str("no-val");
  CHECK_THROWS_WITH(app::run_train_job(options), Catch::Matchers::Contains("need a validation source"));
}
