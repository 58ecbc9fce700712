// Host transfers per training step on a real GPU: `trainkit train`'s stack on `cuda` (norm clipping, 2-step
// accumulation, accuracy, a per-step OneCycleLR, metric rows every 3 steps, a GradScaler under float16
// autocast) copies nothing from the device to the host in a step that writes no metric row, and at most one
// copy in a step that does (loss and metric sums stay on the device between log points).
//
// What tests/app/test_host_reads.cpp counts through RecordFunction (the ops that read a value) this counts
// where CUDA does the work, through LibTorch's Kineto profiler with CUPTI: per optimizer step, the
// device-to-host memory copies the GPU ran ("Memcpy DtoH (...)" activities: item(), a truth value, .cpu(),
// .to(kCPU), non_blocking copies alike) and the host's waits for the device (the runtime calls
// cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize). A blocking copy of a batch to the
// device also waits (ATen's memcpy_and_sync), so waits are reported, not bounded. Each step is one profiler
// session, from the previous step's end (or an epoch's end, or fit's start) to its own, closed after a device
// synchronization so that an asynchronous copy lands in the step that queued it; that one
// cudaDeviceSynchronize is the counter's own and is not counted. What runs between a step's end and the
// epoch's end (validation, the epoch's row) is charged to no step. The first step is warm-up (lazy CUDA
// library and allocator set-up) and is reported but not bounded. Before the run, a calibration session
// checks that the profiler sees a copy and a wait at all: one item() must count one copy and at least one
// wait, so a profiler that records nothing fails here instead of passing.
//
// Without a CUDA device the case skips. scripts/gpu/run.sh runs it on the GPU machine and copies its
// "host-transfers:" lines into the results file; TRAINKIT_FASHION_MNIST_DIR names the data set's folder
// there (default: Debian's, tests/support.h).
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "support.h"
#include "trainkit/app/config.h"
#include "trainkit/app/run.h"
#include "trainkit/train/callback.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;

namespace {
// Named: tests/app/ compiles as one unity unit, where anonymous namespaces of the folder's files merge.
namespace cuda_transfers {

namespace profiler = torch::autograd::profiler;
namespace profiler_impl = torch::profiler::impl;

/// What one profiler session saw.
struct Transfers {
  int64_t dtoh = 0;            ///< "Memcpy DtoH" activities on the GPU
  int64_t stream_syncs = 0;    ///< cudaStreamSynchronize calls
  int64_t device_syncs = 0;    ///< cudaDeviceSynchronize calls, the session's closing one left out
  int64_t event_syncs = 0;     ///< cudaEventSynchronize calls
  int64_t scalar_reads = 0;    ///< aten::_local_scalar_dense ops (item(), truth values), to name a culprit
  int64_t events = 0;          ///< every event of the session
  std::set<std::string> names; ///< the distinct event names (shown when the calibration fails)

  int64_t waits() const { return stream_syncs + device_syncs + event_syncs; }
};

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

/// One Kineto session (CPU ops and CUDA activities) at a time, on the calling thread.
class Session {
 public:
  Session() = default;
  ~Session() {
    if (open_) {
      profiler::disableProfiler();
    }
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void start() {
    const profiler_impl::ProfilerConfig config(profiler_impl::ProfilerState::KINETO);
    const std::set<profiler_impl::ActivityType> activities = {profiler_impl::ActivityType::CPU,
                                                              profiler_impl::ActivityType::CUDA};
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
    open_ = true;
  }

  /// Ends the session after a device synchronization and counts what it saw.
  Transfers stop() {
    torch::cuda::synchronize();  // the counter's own cudaDeviceSynchronize, subtracted below
    std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
    open_ = false;
    Transfers t;
    for (const auto& event : result->events()) {
      const std::string name = event.name();
      ++t.events;
      t.names.insert(name);
      if (starts_with(name, "Memcpy DtoH")) {
        ++t.dtoh;
      } else if (starts_with(name, "cudaStreamSynchronize")) {
        ++t.stream_syncs;
      } else if (starts_with(name, "cudaDeviceSynchronize")) {
        ++t.device_syncs;
      } else if (starts_with(name, "cudaEventSynchronize")) {
        ++t.event_syncs;
      } else if (name == "aten::_local_scalar_dense") {
        ++t.scalar_reads;
      }
    }
    // The closing synchronization must be there: a session without it recorded no CUDA runtime call.
    own_sync_seen_ = t.device_syncs >= 1;
    if (own_sync_seen_) {
      --t.device_syncs;
    }
    return t;
  }
  bool own_sync_seen() const { return own_sync_seen_; }

 private:
  bool open_ = false;
  bool own_sync_seen_ = false;
};

/// Counts per optimizer step, one session per step (added last, it sees the other hooks' transfers of the
/// same step, the metric row's among them).
class TransfersPerStep : public train::Callback {
 public:
  std::map<int64_t, Transfers> steps;
  int64_t sessions_without_own_sync = 0;

  void on_train_begin(train::Trainer&) override { session_.start(); }
  bool on_step_end(train::Trainer&, const train::StepEvent& event) override {
    steps[event.step] = stop();
    session_.start();
    return false;
  }
  bool on_epoch_end(train::Trainer&, const train::EpochEvent&) override {
    stop();  // validation and the epoch's row: charged to no step
    session_.start();
    return false;
  }
  void on_train_end(train::Trainer&) override { stop(); }

 private:
  Transfers stop() {
    Transfers t = session_.stop();
    if (!session_.own_sync_seen()) {
      ++sessions_without_own_sync;
    }
    return t;
  }
  Session session_;
};

std::string data_dir() {
  const char* dir = std::getenv("TRAINKIT_FASHION_MNIST_DIR");
  return dir != nullptr && *dir != '\0' ? dir : trainkit::test::fashion_mnist_dir();
}

bool logs(int64_t step) { return step % 3 == 0; }

std::string line(int64_t step, const Transfers& t) {
  return fmt::format("host-transfers: step {:2d}{}: {} device-to-host copies, {} host waits "
                     "(cudaStreamSynchronize {}, cudaDeviceSynchronize {}, cudaEventSynchronize {}); "
                     "{} item()/truth-value reads",
                     step, step == 1 ? " (warm-up)" : logs(step) ? " (metric row)" : "", t.dtoh, t.waits(),
                     t.stream_syncs, t.device_syncs, t.event_syncs, t.scalar_reads);
}

}  // namespace cuda_transfers
}  // namespace

TEST_CASE("On CUDA a training step copies nothing to the host unless it logs, and then one value",
          "[app][sync][cuda][host_transfers]") {
  using namespace cuda_transfers;
  if (!torch::cuda::is_available()) {
    TRAINKIT_SKIP("no CUDA device: the host transfers of a GPU run cannot be counted here");
  }

  // Calibration: the profiler must see the copy and the wait of one item().
  {
    const torch::Tensor x = torch::ones({16}, torch::kCUDA);
    torch::cuda::synchronize();
    Session session;
    session.start();
    const float sum = x.sum().item<float>();
    const Transfers t = session.stop();
    std::string names;
    for (const auto& name : t.names) {
      names += (names.empty() ? "" : ", ") + name;
    }
    INFO("calibration session: " << t.events << " events: " << names);
    REQUIRE(sum == 16.0F);
    REQUIRE(session.own_sync_seen());
    REQUIRE(t.dtoh == 1);
    REQUIRE(t.waits() >= 1);
  }

  trainkit::test::TempDir tmp("host-transfers-cuda");
  const std::vector<std::string> overrides = {
      "data.dir=\"" + data_dir() + "\"", "data.limit_train=700", "data.limit_test=100", "data.val_size=100",
      "train.batch_size=50", "model.name=\"mlp\"", "model.hidden=16", "train.epochs=2", "train.device=\"cuda\"",
      "grad.clip_norm=1.0", "grad.accumulation_steps=2", "log.every_steps=3", "log.progress=\"lines\"",
      "scheduler.type=\"OneCycleLR\"", "scheduler.max_lr=0.01", "scheduler.total_steps=12",
      "scheduler.interval=\"step\"", "amp.enabled=true", "amp.dtype=\"float16\"", "amp.grad_scaler=true",
      // ATen's fused Adam takes the GradScaler's found_inf and skips on the device; trainkit's own kernels
      // (like PyTorch's non-fused optimizers) need the skip decision on the host, one copy per step
      // (tests/app/test_host_reads.cpp counts both on the test device).
      "optimizer.aten_fused=true"};
  app::Run run = app::build_run(app::parse_config("", "transfers.toml", overrides), "transfers.toml",
                                app::RunOptions().dir(tmp.str("run")));
  auto per_step = std::make_shared<TransfersPerStep>();
  run.trainer->add_callback(per_step);
  run.trainer->fit(*run.train, run.val.get());

  // 12 micro-batches of 50 per epoch, 2 per step: 6 steps x 2 epochs; rows every 3 steps.
  std::string table;
  for (const auto& [step, t] : per_step->steps) {
    table += line(step, t) + "\n";
  }
  std::cout << table << std::flush;  // scripts/gpu/run.sh copies these lines into its results file
  INFO(table);
  REQUIRE(per_step->sessions_without_own_sync == 0);
  REQUIRE(per_step->steps.size() == 12);
  for (const auto& [step, t] : per_step->steps) {
    if (step == 1) {
      continue;  // warm-up: reported above, not bounded
    }
    INFO("step " << step);
    CHECK(t.dtoh <= (logs(step) ? 1 : 0));
  }
}
