// `trainkit train` as a process: exit codes and messages for bad input with nothing written, a run
// interrupted and resumed in a second process that ends bitwise equal to an uninterrupted one, checkpoint
// digests, a file-size limit during a save (clear error, previous checkpoint kept), and stale temporaries.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "state_compare.h"
#include "support.h"
#include "trainkit/nn/models.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/trainer.h"

using trainkit::test::TempDir;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

struct Run {
  int code;
  std::string output;
};

/// Runs the trainkit CLI with `args`, capturing stdout and stderr.
Run trainkit_cli(const std::string& args, const TempDir& tmp) {
  const std::string log = tmp.str("cli-output.txt");
  const std::string cmd = std::string(TRAINKIT_CLI_PATH) + " " + args + " > " + log + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
}

/// A config small enough for a test: 600 training examples, 10 batches per epoch, a tiny CNN, and a
/// per-step OneCycleLR over the whole run (so a resume must restore the scheduler too).
std::string tiny_config(const TempDir& tmp) {
  const std::string path = tmp.str("tiny.toml");
  std::ofstream(path) << "[data]\nval_size = 100\nlimit_train = 600\nlimit_test = 200\n"
                         "[model]\nchannels = [4, 8]\nhidden = 16\ndropout = 0.25\n"
                         "[train]\nepochs = 3\nbatch_size = 50\nseed = 3\n"
                         "[checkpoint]\nkeep_last = 2\n[log]\nevery_steps = 5\nprogress = \"lines\"\n"
                         "[scheduler]\ntype = \"OneCycleLR\"\nmax_lr = 0.01\n";
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The rows of metrics.csv of one kind.
std::vector<std::string> rows_of(const std::string& csv_path, const std::string& kind) {
  std::ifstream in(csv_path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(kind + ",", 0) == 0) {
      out.push_back(line);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("trainkit train rejects bad input with exit code 2 and writes nothing", "[cli][config]") {
  TempDir tmp("cli-bad");
  const std::string config = tiny_config(tmp);
  const std::string out = tmp.str("run");

  SECTION("unknown key in the file") {
    const std::string bad = tmp.str("bad.toml");
    std::ofstream(bad) << "[train]\nepochs = 2\nbatchsize = 64\n";
    const Run r = trainkit_cli("train --config " + bad + " --out " + out, tmp);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Contains("bad.toml") && Contains("train.batchsize"));
  }
  SECTION("wrong type through --set") {
    const Run r = trainkit_cli("train --config " + config + " --out " + out + " --set train.epochs=two", tmp);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Contains("train.epochs") && Contains("integer"));
  }
  SECTION("out of range") {
    const Run r = trainkit_cli("train --config " + config + " --out " + out + " --set optimizer.lr=-1", tmp);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Contains("optimizer.lr"));
  }
  SECTION("bad scheduler argument") {
    const Run r = trainkit_cli("train --config " + config + " --out " + out + " --set scheduler.pct_start=2.0", tmp);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Contains("--set scheduler.pct_start=2.0: pct_start: expected a number in [0, 1], got 2.0"));
  }
  SECTION("val_size larger than the data") {
    const Run r = trainkit_cli("train --config " + config + " --out " + out + " --set data.val_size=600", tmp);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Contains("data.val_size"));
  }
  SECTION("a size that cannot fit in memory names its key") {
    const Run r = trainkit_cli("train --config " + config + " --out " + out + " --set model.hidden=1000000000000", tmp);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Contains("model.hidden") && Contains("integer in [1, 1048576]"));
  }
  SECTION("an --out that holds files and is not a trainkit run is refused, its files untouched") {
    const std::string other = tmp.str("project");
    fs::create_directories(other);
    std::ofstream(other + "/config.toml") << "[tool]\nname = \"someone else's\"\n";
    std::ofstream(other + "/notes.txt") << "keep";
    const Run r = trainkit_cli("train --config " + config + " --out " + other, tmp);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Contains(other) && Contains("config.toml, notes.txt") && Contains("not a trainkit run"));
    CHECK(read_file(other + "/config.toml") == "[tool]\nname = \"someone else's\"\n");
    CHECK_FALSE(fs::exists(other + "/metrics.csv"));
  }
  SECTION("missing data files name the file, exit 1") {
    const Run r = trainkit_cli("train --config " + config + " --out " + out + " --set data.dir=" + tmp.str("nodata"),
                               tmp);
    CHECK(r.code == 1);
    CHECK_THAT(r.output, Contains(tmp.str("nodata")) && Contains("train-images-idx3-ubyte"));
  }
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("trainkit train resumes bitwise identically in a second process", "[cli][resume]") {
  TempDir tmp("cli-resume");
  const std::string config = tiny_config(tmp);
  const std::string straight = tmp.str("straight");
  const std::string split = tmp.str("split");

  // 3 epochs × 10 batches = 30 steps, uninterrupted.
  Run r = trainkit_cli("train --config " + config + " --out " + straight, tmp);
  INFO(r.output);
  REQUIRE(r.code == 0);
  // 13 steps (stops mid-epoch 2), then a new process resumes to the end.
  r = trainkit_cli("train --config " + config + " --out " + split + " --set train.max_steps=13", tmp);
  REQUIRE(r.code == 0);
  REQUIRE(fs::exists(split + "/checkpoints/ckpt-000000013.tkpt"));

  // Without --resume the existing run is refused and left alone.
  const std::string before = read_file(split + "/checkpoints/ckpt-000000013.tkpt");
  r = trainkit_cli("train --config " + config + " --out " + split, tmp);
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Contains("--resume"));
  CHECK(read_file(split + "/checkpoints/ckpt-000000013.tkpt") == before);

  r = trainkit_cli("train --config " + config + " --out " + split + " --resume auto", tmp);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Contains("resumed from") && Contains("ckpt-000000013.tkpt"));

  // Same final model, optimizer state and RNG position.
  const auto load = [](const std::string& dir, torch::nn::Sequential& model, torch::optim::Adam& opt) {
    trainkit::train::Trainer trainer(model, opt);
    torch::serialize::InputArchive in;
    trainkit::train::load_checkpoint(dir + "/checkpoints/ckpt-000000030.tkpt", in);
    trainer.load(in);
    return torch::rand({4});
  };
  auto make = [] { return trainkit::nn::make_cnn(trainkit::nn::CnnOptions().channels({4, 8}).hidden(16)); };
  auto ma = make();
  auto mb = make();
  torch::optim::Adam oa(ma->parameters());
  torch::optim::Adam ob(mb->parameters());
  const at::Tensor ra = load(straight, ma, oa);
  const at::Tensor rb = load(split, mb, ob);
  trainkit::test::require_bitwise_equal_modules(*ma, *mb);
  trainkit::test::require_bitwise_equal_adam(oa, *ma, ob, *mb);
  CHECK(torch::equal(ra, rb));

  // The epoch rows (train loss, validation) and the test result agree to the last printed digit.
  CHECK(rows_of(straight + "/metrics.csv", "epoch") == rows_of(split + "/metrics.csv", "epoch"));
  // (the interrupted process also evaluated on the test set at step 13; the final rows must agree)
  CHECK(rows_of(straight + "/metrics.csv", "test").back() == rows_of(split + "/metrics.csv", "test").back());
  const std::string summary = read_file(split + "/summary.json");
  CHECK_THAT(summary, Contains("\"test_accuracy\"") && Contains("\"steps\": 30") && Contains("\"finished\": true"));
  CHECK(fs::exists(split + "/config.toml"));
  CHECK(fs::exists(split + "/metrics.jsonl"));
  CHECK_THAT(read_file(split + "/curves.svg"), Contains("validation accuracy") && Contains("<polyline"));
  CHECK(trainkit::train::CheckpointManager(split + "/checkpoints", 2).list().size() == 2);  // keep_last

  // digest_checkpoint (and `trainkit checkpoint`) tell the two runs' final checkpoints equal, and two
  // epochs of one run apart, although the files' bytes differ (LibTorch keys optimizer state by address).
  const auto da = trainkit::train::digest_checkpoint(straight + "/checkpoints/ckpt-000000030.tkpt");
  const auto db = trainkit::train::digest_checkpoint(split + "/checkpoints/ckpt-000000030.tkpt");
  CHECK(da.digest == db.digest);
  CHECK(da.step == 30);
  CHECK(da.epoch == 3);
  CHECK(da.tensors == 16);  // 2 convs + 2 linears (weight, bias), 2 batch norms (5 tensors each)
  CHECK(trainkit::train::digest_checkpoint(straight + "/checkpoints/ckpt-000000020.tkpt").digest != da.digest);
  r = trainkit_cli("checkpoint " + straight + "/checkpoints/ckpt-000000030.tkpt", tmp);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Contains(fmt::format("ok, epoch 3 batch 0 step 30, 16 model tensors, digest {:016x}", da.digest)));
}

TEST_CASE("trainkit train under a file-size limit fails clearly and keeps the previous checkpoint", "[cli][checkpoint]") {
  TempDir tmp("cli-fsize");
  const std::string config = tiny_config(tmp);
  const std::string run = tmp.str("run");
  Run r = trainkit_cli("train --config " + config + " --out " + run + " --set train.max_steps=10", tmp);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string ckpt = run + "/checkpoints/ckpt-000000010.tkpt";
  REQUIRE(fs::exists(ckpt));
  const std::string before = read_file(ckpt);
  REQUIRE(before.size() > 100 * 1024);

  // A 64-block limit (32-64 KiB, by shell): the small run files fit, the next checkpoint does not. The CLI
  // ignores SIGXFSZ, so the write fails with EFBIG instead of the signal killing the process.
  const std::string log = tmp.str("fsize-output.txt");
  const int status = std::system(("ulimit -f 64 && " + std::string(TRAINKIT_CLI_PATH) + " train --config " + config +
                                  " --out " + run + " --resume auto > " + log + " 2>&1")
                                     .c_str());
  const std::string output = read_file(log);
  INFO(output);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK_THAT(output, Contains("checkpoint: ") && Contains("ckpt-000000020.tkpt") && Contains("write failed: File too large"));
  CHECK(read_file(ckpt) == before);
  CHECK_FALSE(fs::exists(run + "/checkpoints/ckpt-000000020.tkpt"));
  for (const auto& entry : fs::directory_iterator(run + "/checkpoints")) {
    CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);  // the temporary is removed
  }

  // Without the limit the run resumes from the kept checkpoint and completes.
  r = trainkit_cli("train --config " + config + " --out " + run + " --resume auto", tmp);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Contains("resumed from") && Contains("ckpt-000000010.tkpt"));
  CHECK(fs::exists(run + "/checkpoints/ckpt-000000030.tkpt"));
}

TEST_CASE("a checkpoint temporary left by a killed writer is removed by the next save", "[train][checkpoint]") {
  TempDir tmp("ckpt-stale");
  const std::string dir = tmp.str("ckpts");
  fs::create_directories(dir);
  // A pid that does not run: a child that has exited and been reaped.
  const pid_t dead = ::fork();
  if (dead == 0) {
    ::_exit(0);
  }
  REQUIRE(dead > 0);
  int status = 0;
  ::waitpid(dead, &status, 0);
  const std::string stale = dir + "/.ckpt-000000004.tkpt.tmp." + std::to_string(dead) + ".0a1b2c3d";
  const std::string stale_old_name = dir + "/.ckpt-000000004.tkpt.tmp." + std::to_string(dead);
  const std::string alive = dir + "/.ckpt-000000004.tkpt.tmp." + std::to_string(::getppid()) + ".0a1b2c3d";  // running
  std::ofstream(stale) << "torn";
  std::ofstream(stale_old_name) << "torn";
  std::ofstream(alive) << "in progress";
  trainkit::train::CheckpointManager manager(dir, 2);
  torch::serialize::OutputArchive archive;
  archive.write("x", torch::ones({2}));
  manager.save(5, archive);
  CHECK_FALSE(fs::exists(stale));
  CHECK_FALSE(fs::exists(stale_old_name));
  CHECK(fs::exists(alive));
  CHECK(manager.list().size() == 1);
}

TEST_CASE("trainkit train runs with bf16 autocast, a GradScaler, accumulation and clipping", "[cli][amp][grad]") {
  TempDir tmp("cli-amp");
  const std::string config = tiny_config(tmp);
  const std::string out = tmp.str("run");
  const Run r = trainkit_cli("train --config " + config + " --out " + out +
                                 " --set train.epochs=1 --set amp.enabled=true --set amp.grad_scaler=true"
                                 " --set grad.accumulation_steps=3 --set grad.clip_norm=1.0 --set log.tensorboard=true",
                             tmp);
  INFO(r.output);
  REQUIRE(r.code == 0);
  // 10 micro-batches in windows of 3: 4 optimizer steps (3, 3, 3, 1)
  CHECK_THAT(read_file(out + "/summary.json"), Contains("\"steps\": 4"));
  CHECK_THAT(read_file(out + "/config.toml"), Contains("[amp]") && Contains("grad_scaler = true"));
  bool has_events = false;
  for (const auto& e : fs::directory_iterator(out)) {
    has_events = has_events || e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  CHECK(has_events);
  const Run bad = trainkit_cli("train --config " + config + " --out " + out + "2 --set amp.dtype=float64", tmp);
  CHECK(bad.code == 2);
  CHECK_THAT(bad.output, Contains("amp.dtype"));
}

TEST_CASE("trainkit train writes the step-time profile, the monitors and a profiler trace", "[cli][profile]") {
  TempDir tmp("cli-profile");
  const std::string config = tiny_config(tmp);
  const std::string out = tmp.str("run");
  const Run r = trainkit_cli("train --config " + config + " --out " + out +
                                 " --set train.epochs=1 --set grad.clip_norm=5 --set log.every_steps=2"
                                 " --set profile.trace_steps=2 --set profile.trace_wait=3 --set log.layer_norms=true",
                             tmp);
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Contains("epoch 1 time: ") && Contains("ms/step): data ") &&
                           Contains("profiler: 2 steps recorded to "));
  // 500 training examples in batches of 50: 10 steps, all in summary.json's profile.
  nlohmann::json summary = nlohmann::json::parse(read_file(out + "/summary.json"));
  CHECK(summary["step_times"]["steps"] == 10);
  CHECK(summary["step_times"]["micro_batches"] == 10);
  CHECK(summary["step_times"]["total_s"].is_number());
  REQUIRE(summary["epoch_step_times"].size() == 1);
  CHECK(summary["epoch_step_times"][0]["steps"] == 10);
  // Adam: one group with beta1 as its momentum; clipping by norm: the clip's norm.
  std::ifstream csv(out + "/metrics.csv");
  std::string header;
  std::getline(csv, header);
  CHECK_THAT(header, Catch::Matchers::EndsWith(",val_accuracy,lr_group_0,momentum_group_0,grad_norm"));
  const auto train_rows = rows_of(out + "/metrics.csv", "train");
  REQUIRE(train_rows.size() == 5);
  for (const auto& row : train_rows) {
    CHECK(row.back() != ',');  // grad_norm is filled
  }
  const std::string trace = read_file(out + "/trace.json");
  CHECK(trainkit::test::count_occurrences(trace, "\"trainkit::forward\"") == 2);
  const std::string norms = read_file(out + "/layer_norms.csv");
  CHECK(norms.rfind("step,name,grad_norm,param_norm\n2,", 0) == 0);
  CHECK_THAT(norms, Contains("\n10,"));
}

TEST_CASE("trainkit lr-find writes the curve and suggestions", "[cli][tune]") {
  TempDir tmp("cli-lrfind");
  const std::string config = tiny_config(tmp);
  const std::string out = tmp.str("lr");
  const Run r = trainkit_cli("lr-find --config " + config + " --out " + out + " --num-iter 30 --start-lr 1e-5", tmp);
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Contains("suggested lr"));
  const std::string plain_csv = read_file(out + "/lr_find.csv");
  CHECK_THAT(plain_csv, Contains("lr,loss,smoothed_loss,skipped,scale"));
  CHECK(fs::file_size(out + "/lr_find.svg") > 500);
  // The config's [amp] applies to the test: bfloat16 autocast (the first loss, of the same initial weights,
  // moves) and a GradScaler whose scale is in the CSV.
  const auto first_loss = [](const std::string& csv) {  // the loss field of the first row
    std::stringstream in(csv);
    std::string header;
    std::string lr;
    std::string loss;
    std::getline(in, header);
    std::getline(in, lr, ',');
    std::getline(in, loss, ',');
    return loss;
  };
  const Run amp = trainkit_cli("lr-find --config " + config + " --out " + out + " --num-iter 20 --start-lr 1e-5"
                               " --set amp.enabled=true --set amp.grad_scaler=true --set amp.init_scale=1024",
                               tmp);
  INFO(amp.output);
  REQUIRE(amp.code == 0);
  CHECK_THAT(amp.output, Contains("autocast bfloat16, GradScaler"));
  const std::string amp_csv = read_file(out + "/lr_find.csv");
  CHECK_THAT(amp_csv, Contains(",0,1024\n"));
  CHECK(first_loss(amp_csv) != first_loss(plain_csv));
  const Run bad = trainkit_cli("lr-find --config " + config + " --out " + out + " --start-lr -1", tmp);
  CHECK(bad.code != 0);
  CHECK_THAT(bad.output, Contains("start_lr"));
}

TEST_CASE("trainkit batch-size reports every trial and the answer", "[cli][tune][batch_size]") {
  TempDir tmp("cli-batchsize");
  const std::string config = tiny_config(tmp);
  const Run r = trainkit_cli("batch-size --config " + config + " --mode binsearch --max-val 40 --steps-per-trial 2", tmp);
  INFO(r.output);
  REQUIRE(r.code == 0);
  // 2, 4, ..., 32 fit, then the cap 40 (max_val) fits and the search stops there.
  CHECK_THAT(r.output, Contains("batch size     32: fits"));
  CHECK_THAT(r.output, Contains("batch size found (binsearch): 40"));
  const Run bad = trainkit_cli("batch-size --config " + config + " --steps-per-trial 0", tmp);
  CHECK(bad.code == 2);  // an invalid argument is a usage error (docs/architecture.md, error policy)
  CHECK_THAT(bad.output, Contains("steps_per_trial: 0"));
  const Run no_config = trainkit_cli("batch-size", tmp);
  CHECK(no_config.code == 2);
  CHECK_THAT(no_config.output, Contains("--config is required"));
}
