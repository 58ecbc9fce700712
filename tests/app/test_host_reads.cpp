// Host transfers per training step: a run of `trainkit train`'s stack on the test accelerator
// (tests/device/testdev.h) -- norm clipping, gradient accumulation, accuracy, a per-step OneCycleLR and
// metric rows every 3 steps -- copies nothing from the device to the host in a step that logs nothing, and
// one tensor in a step that logs. With a GradScaler, one more per step (the skip decision, read on the host
// as PyTorch's GradScaler reads it) unless the optimizer steps through ATen's fused kernel, which skips on
// the device. A copy to the host waits for every queued kernel of a GPU; the test device counts each one:
// item(), truth values, .cpu(), .to(kCPU), copy_ into host memory, and ops whose output shape the host must
// read. scripts/gpu/run.sh counts the same on a real GPU.
#include <map>

#include <torch/torch.h>

#include "device/testdev.h"
#include "support.h"
#include "trainkit/amp/autocast.h"
#include "trainkit/app/config.h"
#include "trainkit/app/run.h"
#include "trainkit/compat.h"
#include "trainkit/train/callback.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;

namespace {

/// The copies to the host between consecutive optimizer steps, by step (added last: it sees the other
/// hooks' copies of the same step); what an epoch's end copies (validation, the epoch's summary) is not
/// charged to a step.
class CopiesToHostPerStep : public train::Callback {
 public:
  std::map<int64_t, int64_t> reads;
  bool on_step_end(train::Trainer&, const train::StepEvent& event) override {
    const int64_t now = test::transfers().to_host;
    reads[event.step] = now - last_;
    last_ = now;
    return false;
  }
  bool on_epoch_end(train::Trainer&, const train::EpochEvent&) override {
    last_ = test::transfers().to_host;
    return false;
  }
  void on_train_begin(train::Trainer&) override { last_ = test::transfers().to_host; }

 private:
  int64_t last_ = 0;
};

}  // namespace

namespace {

/// Copies to the host per optimizer step of a 2-epoch run on the test device of `trainkit train`'s stack with `overrides` added.
std::map<int64_t, int64_t> reads_per_step(const std::vector<std::string>& extra) {
  test::register_test_device();  // before the config names "testdev"
  trainkit::test::TempDir tmp("host-reads");
  std::vector<std::string> overrides = {
      "data.limit_train=700",  "data.limit_test=100",      "data.val_size=100",   "train.batch_size=50",
      "model.name=\"mlp\"",    "model.hidden=16",          "train.epochs=2",      "train.device=\"testdev\"",
      "grad.clip_norm=1.0",    "grad.accumulation_steps=2", "log.every_steps=3",   "log.progress=\"lines\"",
      "scheduler.type=\"OneCycleLR\"", "scheduler.max_lr=0.01", "scheduler.total_steps=12",
      "scheduler.interval=\"step\""};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  app::Run run = app::build_run(app::parse_config("", "reads.toml", overrides), "reads.toml",
                                app::RunOptions().dir(tmp.str("run")));
  REQUIRE(run.device == test::test_device(0));
  auto per_step = std::make_shared<CopiesToHostPerStep>();
  run.trainer->add_callback(per_step);
  const test::TransferCounter counter;
  run.trainer->fit(*run.train, run.val.get());
  INFO("copies to the host during the run: " << counter.causes());
  CHECK(counter.to_host() > 0);  // the epochs' ends read the validation results
  return per_step->reads;
}

std::string table(const std::map<int64_t, int64_t>& reads) {
  std::string out;
  for (const auto& [step, n] : reads) {
    out += fmt::format("step {}: {} copies to the host\n", step, n);
  }
  return out;
}

}  // namespace

TEST_CASE("A training step copies nothing to the host unless it logs, and then one tensor", "[app][sync]") {
  // 12 micro-batches of 50 per epoch, 2 per step: 6 steps x 2 epochs; rows every 3 steps.
  const auto reads = reads_per_step({});
  REQUIRE(reads.size() == 12);
  INFO(table(reads));
  for (const auto& [step, n] : reads) {
    // A logging step copies the interval's mean loss and the gradient norm the clipping computed, together.
    CHECK(n == (step % 3 == 0 ? 1 : 0));
  }
}

TEST_CASE("With a GradScaler a step copies one value to the host: whether to skip it", "[app][sync][amp]") {
  // As PyTorch's GradScaler.step for optimizers without a fused kernel, the skip decision is read on the host
  // (found_inf.item()) once per step. (Autocast has no test-device kernels: the scaler runs on float32.)
  const auto reads = reads_per_step({"amp.grad_scaler=true"});
  REQUIRE(reads.size() == 12);
  INFO(table(reads));
  for (const auto& [step, n] : reads) {
    CHECK(n == (step % 3 == 0 ? 2 : 1));
  }
}

TEST_CASE("With a GradScaler and ATen's fused Adam a step copies nothing: the skip is decided on the device",
          "[app][sync][amp][aten_fused]") {
  // As PyTorch's GradScaler with fused=True: the scaler hands found_inf (and the scale) to the kernel.
  const auto reads = reads_per_step({"amp.grad_scaler=true", "optimizer.aten_fused=true"});
  REQUIRE(reads.size() == 12);
  INFO(table(reads));
  for (const auto& [step, n] : reads) {
    CHECK(n == (step % 3 == 0 ? 1 : 0));
  }
}
