// Host reads per training step: a run of `trainkit train`'s stack with norm clipping, gradient
// accumulation, accuracy, a per-step OneCycleLR and metric rows every 3 steps reads no value from the
// device in a step that logs nothing; with a GradScaler under float16 autocast, one (the skip decision),
// none when the optimizer steps through ATen's fused kernel (the skip is decided on the device). A host
// read stalls a GPU pipeline; it is counted here as the ops that produce one (aten::_local_scalar_dense
// behind item() and bool conversions, aten::nonzero, aten::equal, aten::is_nonzero), through a global
// RecordFunction callback. What the ops do does not depend on the device, so the count holds for CUDA, with
// one exception left out of the count: the CPU kernels of aten::_fused_adam_/_fused_adamw_/_fused_sgd_ read
// their step count with item() from CPU memory, where their CUDA kernels read it on the device.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "support.h"
#include "trainkit/amp/autocast.h"
#include "trainkit/app/config.h"
#include "trainkit/app/run.h"
#include "trainkit/compat.h"
#include "trainkit/train/callback.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;

namespace {

std::atomic<int64_t> g_host_reads{0};
/// Depth of ATen fused optimizer kernels on this thread (their CPU kernels' own item() is not counted).
thread_local int t_in_fused_kernel = 0;

bool is_fused_kernel(const char* op) {
  return std::strncmp(op, "aten::_fused_", std::strlen("aten::_fused_")) == 0;
}

bool is_host_read(const char* op) {
  for (const char* name : {"aten::_local_scalar_dense", "aten::nonzero", "aten::equal", "aten::is_nonzero"}) {
    if (std::strcmp(op, name) == 0) {
      return true;
    }
  }
  return false;
}

/// Counts host-read ops on every thread while it lives.
class HostReadCounter {
 public:
  HostReadCounter()
      : handle_(at::addGlobalCallback(
            at::RecordFunctionCallback(
                [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                  if (is_fused_kernel(fn.name())) {
                    ++t_in_fused_kernel;
                  } else if (t_in_fused_kernel == 0 && is_host_read(fn.name())) {
                    ++g_host_reads;
                  }
                  return nullptr;
                },
                [](const at::RecordFunction& fn, at::ObserverContext*) {
                  if (is_fused_kernel(fn.name())) {
                    --t_in_fused_kernel;
                  }
                })
                .scopes({at::RecordScope::FUNCTION}))) {}
  ~HostReadCounter() { at::removeCallback(handle_); }
  HostReadCounter(const HostReadCounter&) = delete;
  HostReadCounter& operator=(const HostReadCounter&) = delete;

 private:
  at::CallbackHandle handle_;
};

/// The host reads between consecutive optimizer steps, by step (added last: it sees the other hooks'
/// reads of the same step); what an epoch's end reads (validation) is not charged to a step.
class ReadsPerStep : public train::Callback {
 public:
  std::map<int64_t, int64_t> reads;
  bool on_step_end(train::Trainer&, const train::StepEvent& event) override {
    const int64_t now = g_host_reads.load();
    reads[event.step] = now - last_;
    last_ = now;
    return false;
  }
  bool on_epoch_end(train::Trainer&, const train::EpochEvent&) override {
    last_ = g_host_reads.load();
    return false;
  }
  void on_train_begin(train::Trainer&) override { last_ = g_host_reads.load(); }

 private:
  int64_t last_ = 0;
};

}  // namespace

namespace {

/// Host reads per optimizer step of a 2-epoch run of `trainkit train`'s stack with `overrides` added.
std::map<int64_t, int64_t> reads_per_step(const std::vector<std::string>& extra) {
  trainkit::test::TempDir tmp("host-reads");
  std::vector<std::string> overrides = {
      "data.limit_train=700",  "data.limit_test=100",      "data.val_size=100",   "train.batch_size=50",
      "model.name=\"mlp\"",    "model.hidden=16",          "train.epochs=2",      "train.device=\"cpu\"",
      "grad.clip_norm=1.0",    "grad.accumulation_steps=2", "log.every_steps=3",   "log.progress=\"lines\"",
      "scheduler.type=\"OneCycleLR\"", "scheduler.max_lr=0.01", "scheduler.total_steps=12",
      "scheduler.interval=\"step\""};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  app::Run run = app::build_run(app::parse_config("", "reads.toml", overrides), "reads.toml",
                                app::RunOptions().dir(tmp.str("run")));
  auto per_step = std::make_shared<ReadsPerStep>();
  run.trainer->add_callback(per_step);
  HostReadCounter counter;
  run.trainer->fit(*run.train, run.val.get());
  return per_step->reads;
}

std::string table(const std::map<int64_t, int64_t>& reads) {
  std::string out;
  for (const auto& [step, n] : reads) {
    out += fmt::format("step {}: {} reads\n", step, n);
  }
  return out;
}

}  // namespace

TEST_CASE("A training step reads nothing from the device unless it logs", "[app][sync]") {
  // 12 micro-batches of 50 per epoch, 2 per step: 6 steps x 2 epochs; rows every 3 steps.
  const auto reads = reads_per_step({});
  REQUIRE(reads.size() == 12);
  INFO(table(reads));
  for (const auto& [step, n] : reads) {
    // A logging step reads the interval's mean loss and the gradient norm the clipping computed.
    CHECK(n == (step % 3 == 0 ? 2 : 0));
  }
}

TEST_CASE("With a GradScaler a step reads one value: whether to skip it", "[app][sync][amp][may-skip]") {
  // As PyTorch's GradScaler.step for optimizers without a fused kernel, the skip decision is read on the host
  // (found_inf.item()) once per step.
  if (!amp::is_autocast_dtype_supported(torch::kCPU, torch::kHalf)) {
    TRAINKIT_SKIP("float16 autocast on the CPU needs LibTorch >= 2.5; this is " << compat::torch_version());
  }
  const auto reads = reads_per_step({"amp.enabled=true", "amp.dtype=\"float16\"", "amp.grad_scaler=true"});
  REQUIRE(reads.size() == 12);
  INFO(table(reads));
  for (const auto& [step, n] : reads) {
    CHECK(n == (step % 3 == 0 ? 3 : 1));
  }
}

TEST_CASE("With a GradScaler and ATen's fused Adam a step reads nothing: the skip is decided on the device",
          "[app][sync][amp][aten_fused][may-skip]") {
  // As PyTorch's GradScaler with fused=True: the scaler hands found_inf (and the scale) to the kernel.
  if (!amp::is_autocast_dtype_supported(torch::kCPU, torch::kHalf)) {
    TRAINKIT_SKIP("float16 autocast on the CPU needs LibTorch >= 2.5; this is " << compat::torch_version());
  }
  const auto reads = reads_per_step(
      {"amp.enabled=true", "amp.dtype=\"float16\"", "amp.grad_scaler=true", "optimizer.aten_fused=true"});
  REQUIRE(reads.size() == 12);
  INFO(table(reads));
  for (const auto& [step, n] : reads) {
    CHECK(n == (step % 3 == 0 ? 2 : 0));
  }
}
