// Resource hygiene: a training run that fails mid-epoch — a sample that cannot be
// loaded, with loader worker threads running, metrics and TensorBoard files, checkpoints, a profiler trace
// window and per-layer norms open — leaves no thread and no file descriptor behind once its objects are
// gone. The baseline is taken after the same run succeeded once, so that LibTorch's lazily created thread
// pools are already there.
#include <atomic>
#include <filesystem>
#include <memory>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/data/parallel_loader.h"
#include "trainkit/log/metrics.h"
#include "trainkit/log/summary_writer.h"
#include "trainkit/nn/models.h"
#include "trainkit/train/callbacks/metrics_logger.h"
#include "trainkit/train/callbacks/norm_monitor.h"
#include "trainkit/train/callbacks/profiler_trace.h"
#include "trainkit/train/callbacks/trainer_checkpoint.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;

namespace {

int64_t entries(const char* dir) {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) {
    ++n;
  }
  return n;
}

/// One run with every hook that opens files or starts threads; the `fail_at`-th sample loaded (counted
/// over both epochs) throws (-1: none).
void run(const test::TempDir& dir, int64_t fail_at) {
  auto loaded = std::make_shared<std::atomic<int64_t>>(0);
  torch::manual_seed(0);
  auto model = nn::make_mlp(nn::MlpOptions().in_features(16).hidden({32}).num_classes(3));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));
  data::ParallelLoader loader(
      256,
      [fail_at, loaded](int64_t i, at::Generator& gen) {
        if ((*loaded)++ == fail_at) {
          throw std::runtime_error("cannot load sample " + std::to_string(i));
        }
        const at::Tensor x = torch::randn({16}, gen, torch::TensorOptions().dtype(torch::kFloat));
        return data::Batch(x, x.narrow(0, 0, 3).argmax());
      },
      data::ParallelLoaderOptions().batch_size(16).shuffle(false).num_workers(3));
  train::Trainer trainer(model, optimizer, train::TrainerOptions().epochs(2));
  const std::string out = dir.str("run");
  std::filesystem::create_directories(out);
  auto tensorboard = std::make_shared<log::SummaryWriter>(out);
  trainer.add_callback(std::make_shared<train::MetricsLogger>(std::make_shared<log::MetricsWriter>(out, false), 2,
                                                                false, tensorboard));
  trainer.add_callback(std::make_shared<train::NormMonitor>(
      *model, train::NormMonitorOptions().every_steps(2).csv_path(out + "/norms.csv"), tensorboard));
  trainer.add_callback(std::make_shared<train::TrainerCheckpoint>(
      std::make_shared<train::CheckpointManager>(out + "/checkpoints", 2), 3));
  trainer.add_callback(
      std::make_shared<train::ProfilerTrace>(train::ProfilerTraceOptions(out + "/trace.json").wait(20).active(50)));
  trainer.fit(loader);
}

}  // namespace

TEST_CASE("a run that fails mid-epoch leaves no thread or descriptor behind", "[train][hygiene]") {
  test::TempDir dir("hygiene");
  run(dir, -1);  // succeeds, and creates LibTorch's thread pools
  std::filesystem::remove_all(dir.path() / "run");
  const int64_t threads = entries("/proc/self/task");
  const int64_t fds = entries("/proc/self/fd");
  // The 400th sample loaded is in batch ~25 of 32 (epochs have 16 batches; workers load a few ahead): after
  // checkpoints were written and while the profiler window (steps 21..70) records.
  CHECK_THROWS_WITH(run(dir, 400), Catch::Contains("cannot load sample"));
  CHECK(entries("/proc/self/task") == threads);
  CHECK(entries("/proc/self/fd") == fds);
}
