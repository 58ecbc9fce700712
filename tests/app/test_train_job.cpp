// `trainkit train` (run_train_job) with [ema], [swa], [early_stopping] and checkpoint.save_top_k turned on,
// checked against oracles built from the run's own per-step checkpoints (checkpoint.every_steps = 1): the
// EMA is recomputed from the raw weights of every step with timm's ModelEmaV3 rule, the SWA average is the
// mean of the epoch-end weights from swa_start on, the best/ files are the epochs with the lowest val/loss
// in metrics.jsonl, and val_ema/loss is recomputed by a forward pass with the EMA weights. A second run
// without EMA and SWA must end with bitwise the same raw weights (evaluating the averages leaves the
// model's own weights untouched), and EarlyStopping must end a run before its last epoch. The interchange
// copies (checkpoint.export: model/ema/swa .safetensors, or .pth) hold the same weights.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "support.h"
#include "trainkit/app/config.h"
#include "trainkit/app/jobs.h"
#include "trainkit/app/run.h"
#include "trainkit/io/safetensors.h"
#include "trainkit/io/torch_save.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/ema.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;
namespace fs = std::filesystem;

namespace {

using Weights = std::vector<at::Tensor>;

// 200 training images (300 less the 100 held out for validation) in batches of 50: 4 steps per epoch, 4 epochs, a checkpoint after every step.
const char* const kAveragingConfig =
    "[data]\nval_size = 100\nlimit_train = 300\nlimit_test = 100\n"
    "[model]\nname = \"mlp\"\nhidden = 16\n"
    "[optimizer]\nname = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n"
    "[train]\nepochs = 4\nbatch_size = 50\nseed = 5\nthreads = 1\n"
    "[checkpoint]\nevery_steps = 1\nkeep_last = 100\nsave_top_k = 2\nsave_last = true\n"
    "[log]\nprogress = \"lines\"\n";

const char* const kAveragingSections =
    "[ema]\nenabled = true\ndecay = 0.5\n"
    "[swa]\nenabled = true\nswa_start = 1\n";

Weights copy_of(const torch::nn::Module& module) {
  Weights out;
  for (const at::Tensor& t : train::weight_tensors(module)) {
    out.push_back(t.clone());
  }
  return out;
}

void assign(torch::nn::Module& module, const Weights& values) {
  torch::NoGradGuard no_grad;
  const Weights targets = train::weight_tensors(module);
  REQUIRE(targets.size() == values.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    targets[i].copy_(values[i]);
  }
}

// The raw model weights of every checkpoint in <run>/checkpoints, by optimizer step.
std::map<int64_t, Weights> weights_by_step(app::Run& run, const std::string& run_dir) {
  std::map<int64_t, Weights> out;
  for (const auto& entry : fs::directory_iterator(fs::path(run_dir) / "checkpoints")) {
    if (entry.path().extension() != ".tkpt") {
      continue;
    }
    torch::serialize::InputArchive archive;
    train::load_checkpoint(entry.path().string(), archive);
    run.trainer->load(archive);
    out[run.trainer->state().step] = copy_of(*run.model);
  }
  return out;
}

// A weights-only file (save_weights) read into the run's model.
Weights weights_file(app::Run& run, const fs::path& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path.string());
  run.model->load(archive);
  return copy_of(*run.model);
}

double max_abs_diff(const Weights& a, const Weights& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].sizes() == b[i].sizes());
    worst = std::max(worst, (a[i].to(torch::kFloat64) - b[i].to(torch::kFloat64)).abs().max().item<double>());
  }
  return worst;
}

bool bitwise_equal(const Weights& a, const Weights& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) {
      return false;
    }
  }
  return true;
}

// The "epoch" rows of a run's metrics.jsonl, in order.
std::vector<nlohmann::json> epoch_rows(const std::string& run_dir) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json row = nlohmann::json::parse(line);
    if (row["kind"] == "epoch") {
      rows.push_back(row);
    }
  }
  return rows;
}

app::TrainJobResult train_job(const trainkit::test::TempDir& tmp, const std::string& name, const std::string& toml) {
  const std::string config = tmp.str(name + ".toml");
  std::ofstream(config) << toml;
  app::TrainJobOptions options;
  options.config_path = config;
  options.out_dir = tmp.str(name);
  return app::run_train_job(options);
}

}  // namespace

TEST_CASE("trainkit train: EMA, SWA and best-k files equal their oracles from the per-step weights",
          "[app][train-job][ema][swa]") {
  trainkit::test::TempDir tmp("train-job-averaging");
  const app::TrainJobResult result = train_job(tmp, "averaged", std::string(kAveragingConfig) + kAveragingSections);
  REQUIRE(result.steps == 16);
  REQUIRE(result.finished);
  const std::string dir = result.run_dir;

  app::Run run = app::build_run(app::parse_config(trainkit::test::read_text(tmp.str("averaged.toml")), "averaged.toml", {}), "averaged.toml");
  const std::map<int64_t, Weights> raw = weights_by_step(run, dir);
  for (int64_t step = 1; step <= 16; ++step) {
    REQUIRE(raw.count(step) == 1);
  }

  // timm's ModelEmaV3 with update_after_step = 0 and no warmup: a copy at step 1, then
  // ema <- ema + (1 - decay) (w - ema) with decay 0.5.
  std::map<int64_t, Weights> ema;
  ema[1] = raw.at(1);
  for (int64_t step = 2; step <= 16; ++step) {
    Weights next;
    for (size_t i = 0; i < raw.at(step).size(); ++i) {
      next.push_back(0.5 * ema[step - 1][i] + 0.5 * raw.at(step)[i]);
    }
    ema[step] = next;
  }
  SECTION("ema.pt is the EMA of the weights of every step") {
    REQUIRE(fs::exists(fs::path(dir) / "ema.pt"));
    const Weights got = weights_file(run, fs::path(dir) / "ema.pt");
    CHECK(max_abs_diff(got, ema.at(16)) < 1e-6);
    CHECK(max_abs_diff(got, raw.at(16)) > 1e-4);  // not the raw weights
  }
  SECTION("val_ema/loss is the loss of the EMA weights on the validation set") {
    const std::vector<nlohmann::json> rows = epoch_rows(dir);
    REQUIRE(rows.size() == 4);
    for (const nlohmann::json& row : rows) {
      const int64_t step = row["step"];
      INFO("epoch row " << row.dump());
      REQUIRE(row.contains("val_ema/loss"));
      assign(*run.model, ema.at(step));
      run.model->eval();
      torch::NoGradGuard no_grad;
      run.val->set_epoch(0);
      double loss_sum = 0;
      int64_t count = 0;
      while (const auto batch = run.val->next()) {
        const at::Tensor logits = run.forward(*batch);
        loss_sum += torch::nn::functional::cross_entropy(
                        logits, batch->target(), torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                        .item<double>();
        count += logits.size(0);
      }
      REQUIRE(count == 100);
      CHECK(row["val_ema/loss"].get<double>() == Approx(loss_sum / static_cast<double>(count)).epsilon(1e-6));
      CHECK(std::abs(row["val_ema/loss"].get<double>() - row["val_loss"].get<double>()) > 1e-6);
    }
  }
  SECTION("swa.pt is the mean of the epoch-end weights from swa_start on") {
    REQUIRE(fs::exists(fs::path(dir) / "swa.pt"));
    Weights mean;
    for (size_t i = 0; i < raw.at(8).size(); ++i) {  // epochs 1, 2, 3 (0-based) end at steps 8, 12, 16
      mean.push_back((raw.at(8)[i] + raw.at(12)[i] + raw.at(16)[i]) / 3.0);
    }
    const Weights got = weights_file(run, fs::path(dir) / "swa.pt");
    CHECK(max_abs_diff(got, mean) < 1e-6);
    CHECK(max_abs_diff(got, raw.at(16)) > 1e-4);
  }
  SECTION("model, ema and swa .safetensors (checkpoint.export's default) hold the same weights") {
    const auto from_safetensors = [&run](const fs::path& path) {
      REQUIRE(fs::exists(path));
      io::load_safetensors(*run.model, path.string(), io::LoadOptions().strict(true));
      return copy_of(*run.model);
    };
    CHECK(bitwise_equal(from_safetensors(fs::path(dir) / "model.safetensors"), raw.at(16)));
    CHECK(bitwise_equal(from_safetensors(fs::path(dir) / "ema.safetensors"), weights_file(run, fs::path(dir) / "ema.pt")));
    CHECK(bitwise_equal(from_safetensors(fs::path(dir) / "swa.safetensors"), weights_file(run, fs::path(dir) / "swa.pt")));
    CHECK_FALSE(fs::exists(fs::path(dir) / "model.pth"));
  }
  SECTION("best/ holds the two epochs with the lowest val/loss, and last.pt the final weights") {
    const std::vector<nlohmann::json> rows = epoch_rows(dir);
    REQUIRE(rows.size() == 4);
    std::vector<std::pair<double, nlohmann::json>> ranked;
    for (const nlohmann::json& row : rows) {
      ranked.emplace_back(row["val_loss"].get<double>(), row);
    }
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::string> expected;
    for (size_t i = 0; i < 2; ++i) {
      const nlohmann::json& row = ranked[i].second;
      const std::string stem = fmt::format("epoch={}-step={}", row["epoch"].get<int64_t>(), row["step"].get<int64_t>());
      expected.push_back(stem + ".pt");
      expected.push_back(stem + ".safetensors");  // checkpoint.export's default, deleted with its .pt
    }
    expected.emplace_back("last.pt");
    expected.emplace_back("last.safetensors");
    std::sort(expected.begin(), expected.end());
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(fs::path(dir) / "best")) {
      files.push_back(entry.path().filename().string());
    }
    std::sort(files.begin(), files.end());
    CHECK(files == expected);
    for (size_t i = 0; i < 2; ++i) {
      const int64_t step = ranked[i].second["step"];
      const fs::path file = fs::path(dir) / "best" /
                            fmt::format("epoch={}-step={}.pt", ranked[i].second["epoch"].get<int64_t>(), step);
      INFO(file);
      CHECK(bitwise_equal(weights_file(run, file), raw.at(step)));
      io::load_safetensors(*run.model, fs::path(file).replace_extension(".safetensors").string(),
                           io::LoadOptions().strict(true));
      CHECK(bitwise_equal(copy_of(*run.model), raw.at(step)));
    }
    CHECK(bitwise_equal(weights_file(run, fs::path(dir) / "best" / "last.pt"), raw.at(16)));
    io::load_safetensors(*run.model, (fs::path(dir) / "best" / "last.safetensors").string(),
                         io::LoadOptions().strict(true));
    CHECK(bitwise_equal(copy_of(*run.model), raw.at(16)));
  }
  SECTION("the raw weights are bitwise those of the same run without EMA and SWA") {
    const app::TrainJobResult plain = train_job(tmp, "plain", kAveragingConfig);
    REQUIRE(plain.steps == 16);
    app::Run plain_run =
        app::build_run(app::parse_config(trainkit::test::read_text(tmp.str("plain.toml")), "plain.toml", {}), "plain.toml");
    const std::map<int64_t, Weights> plain_raw = weights_by_step(plain_run, plain.run_dir);
    for (const int64_t step : {4, 5, 8, 16}) {
      INFO("step " << step);
      CHECK(bitwise_equal(plain_raw.at(step), raw.at(step)));
    }
    CHECK_FALSE(fs::exists(fs::path(plain.run_dir) / "ema.pt"));
    CHECK_FALSE(fs::exists(fs::path(plain.run_dir) / "swa.pt"));
  }
}

TEST_CASE("trainkit train: [early_stopping] ends the run before its last epoch", "[app][train-job][early-stopping]") {
  trainkit::test::TempDir tmp("train-job-early-stopping");
  // No change of val/loss counts as an improvement against min_delta = 100: the first validation sets the
  // best value, the second is one epoch without improvement, which is patience 1's limit.
  const std::string config =
      "[data]\nval_size = 100\nlimit_train = 300\nlimit_test = 100\n"
      "[model]\nname = \"mlp\"\nhidden = 16\n"
      "[train]\nepochs = 6\nbatch_size = 50\nseed = 5\nthreads = 1\n"
      "[early_stopping]\nenabled = true\npatience = 1\nmin_delta = 100.0\n"
      "[checkpoint]\nexport = [\"state_dict\"]\n"
      "[log]\nprogress = \"lines\"\n";
  const app::TrainJobResult result = train_job(tmp, "stopped", config);
  CHECK(result.epochs == 2);
  CHECK(result.steps == 8);
  CHECK_FALSE(result.finished);
  CHECK(epoch_rows(result.run_dir).size() == 2);
  const nlohmann::json summary = nlohmann::json::parse(trainkit::test::read_text(fs::path(result.run_dir) / "summary.json"));
  CHECK(summary["finished"] == false);
  CHECK(summary["epochs"] == 2);
  // checkpoint.export = ["state_dict"]: model.pth (torch.save) holds the final weights, no safetensors copy.
  const io::TensorDict state = io::load_pt((fs::path(result.run_dir) / "model.pth").string());
  CHECK(state.size() == 4);  // two Linear layers: weight and bias each
  CHECK_FALSE(fs::exists(fs::path(result.run_dir) / "model.safetensors"));
}

TEST_CASE("trainkit train: summary.json's time_to_accuracy names the first validation to reach each threshold",
          "[app][train-job][time-to-accuracy]") {
  trainkit::test::TempDir tmp("train-job-time-to-accuracy");
  const std::string base =
      "[data]\nval_size = 100\nlimit_train = 300\nlimit_test = 100\n"
      "[model]\nname = \"mlp\"\nhidden = 16\n"
      "[optimizer]\nname = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n"
      "[train]\nepochs = 4\nbatch_size = 50\nseed = 5\nthreads = 1\n";
  const std::vector<double> thresholds = {0.05, 0.3, 0.5, 0.6, 0.7, 0.999};
  const app::TrainJobResult result =
      train_job(tmp, "timed", base + "[log]\nprogress = \"lines\"\ntime_to_accuracy = [0.05, 0.3, 0.5, 0.6, 0.7, 0.999]\n");
  const nlohmann::json summary = nlohmann::json::parse(trainkit::test::read_text(fs::path(result.run_dir) / "summary.json"));
  const std::vector<nlohmann::json> rows = epoch_rows(result.run_dir);
  REQUIRE(rows.size() == 4);
  REQUIRE(summary["time_to_accuracy"].size() == thresholds.size());
  double previous = 0;
  int64_t reached = 0;
  for (size_t i = 0; i < thresholds.size(); ++i) {
    const nlohmann::json& entry = summary["time_to_accuracy"][i];
    INFO("threshold " << thresholds[i] << ": " << entry.dump());
    CHECK(entry["threshold"].get<double>() == thresholds[i]);
    // The oracle: the first epoch row of metrics.jsonl whose validation accuracy reaches the threshold.
    const auto first = std::find_if(rows.begin(), rows.end(), [&](const nlohmann::json& row) {
      return row["val_accuracy"].get<double>() >= thresholds[i];
    });
    if (first == rows.end()) {
      CHECK(entry["seconds"].is_null());
      CHECK_FALSE(entry.contains("epoch"));
      continue;
    }
    ++reached;
    CHECK(entry["epoch"].get<int64_t>() == (*first)["epoch"].get<int64_t>() + 1);
    CHECK(entry["step"].get<int64_t>() == (*first)["step"].get<int64_t>());
    CHECK(entry["accuracy"].get<double>() == Approx((*first)["val_accuracy"].get<double>()).margin(1e-12));
    const double seconds = entry["seconds"].get<double>();
    CHECK(seconds > 0);
    CHECK(seconds >= previous);  // a higher threshold is reached no sooner
    CHECK(seconds <= summary["wall_seconds"].get<double>());
    previous = seconds;
  }
  CHECK(reached >= 1);  // 0.05 at the first validation, at least
  CHECK(summary["time_to_accuracy"].back()["seconds"].is_null());  // 0.999: 100 images after 16 steps

  // Without the key, no field; a key it cannot time is refused before anything runs.
  const app::TrainJobResult untimed = train_job(tmp, "untimed", base + "[log]\nprogress = \"lines\"\n");
  CHECK_FALSE(nlohmann::json::parse(trainkit::test::read_text(fs::path(untimed.run_dir) / "summary.json"))
                  .contains("time_to_accuracy"));
  std::string no_accuracy = base;
  no_accuracy.replace(no_accuracy.find("[train]\n"), 8, "[train]\nmetrics = []\n");
  CHECK_THROWS_MATCHES(train_job(tmp, "no-accuracy", no_accuracy + "[log]\ntime_to_accuracy = [0.5]\n"),
                       app::ConfigError, trainkit::test::WhatContains("log.time_to_accuracy") &&
                                             trainkit::test::WhatContains("\"accuracy\""));
  CHECK_THROWS_MATCHES(train_job(tmp, "out-of-range", base + "[log]\ntime_to_accuracy = [1.5]\n"), app::ConfigError,
                       trainkit::test::WhatContains("time_to_accuracy") && trainkit::test::WhatContains("(0, 1]"));
}

TEST_CASE("trainkit train: model.channels_last takes the CNN's first step to the same weights in NHWC",
          "[app][train-job][channels-last]") {
  trainkit::test::TempDir tmp("train-job-channels-last");
  const auto config = [](bool channels_last) {
    return std::string("[data]\nval_size = 100\nlimit_train = 150\nlimit_test = 100\n") +
           "[model]\nname = \"cnn\"\nchannels = [4, 8]\nhidden = 16\nchannels_last = " +
           (channels_last ? "true" : "false") +
           "\n[optimizer]\nname = \"adam\"\nlr = 0.01\n"
           "[train]\nepochs = 1\nbatch_size = 50\nseed = 3\nthreads = 1\n"
           "[log]\nprogress = \"lines\"\n";
  };
  const app::TrainJobResult nchw = train_job(tmp, "nchw", config(false));
  const app::TrainJobResult nhwc = train_job(tmp, "nhwc", config(true));
  // The same computation in another memory layout: float32 convolutions that sum in another order. One step
  // (50 training images): later steps amplify those last-bit differences through max pooling's argmax and
  // Adam's sign-like first updates (2 steps: weights 3e-4 apart, as seen on the Intel VM; 1 step: 6e-8).
  CHECK(nhwc.test_loss == Approx(nchw.test_loss).epsilon(1e-4));
  const io::TensorDict a = io::load_safetensors((fs::path(nchw.run_dir) / "model.safetensors").string()).tensors;
  const io::TensorDict b = io::load_safetensors((fs::path(nhwc.run_dir) / "model.safetensors").string()).tensors;
  REQUIRE(a.size() == b.size());
  for (const auto& item : a.items()) {
    INFO(item.key());
    CHECK(torch::allclose(b[item.key()], item.value(), 1e-4, 1e-5));
  }
  // The layout itself: the convolution weights are channels-last after the run is built, by the strides that
  // oneDNN and cuDNN go by (suggest_memory_format), also the first one's with its single input channel
  // (whose NCHW strides count as channels-last-contiguous, so that contiguous(ChannelsLast) left them NCHW and
  // the first block ran in NCHW).
  app::Run run = app::build_run(app::parse_config(config(true), "cl.toml", {}), "cl.toml",
                                app::RunOptions().dir(tmp.str("built")));
  int64_t conv_weights = 0;
  for (const at::Tensor& p : run.model->parameters()) {
    if (p.dim() == 4) {
      INFO("weight of shape " << p.sizes() << ", strides " << p.strides());
      CHECK(p.is_contiguous(at::MemoryFormat::ChannelsLast));
      CHECK(p.suggest_memory_format() == at::MemoryFormat::ChannelsLast);
      CHECK(p.stride(1) == 1);
      ++conv_weights;
    }
  }
  CHECK(conv_weights == 2);
}
