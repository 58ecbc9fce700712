#pragma once
/// @file
/// One function builds a training run from a Config: data and model (from the Catalog's providers),
/// optimizer, scheduler, and a Trainer with clipping, accumulation, autocast, GradScaler, DDP, checkpoints
/// and logging, as the config says. The CLI and every app that trains use it, so every app honours every
/// config section.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include "trainkit/app/config.h"
#include "trainkit/app/providers.h"
#include "trainkit/features.h"
#include "trainkit/log/metrics.h"
#include "trainkit/log/mlflow.h"
#include "trainkit/log/summary_writer.h"
#include "trainkit/sched/factory.h"
#include "trainkit/train/callbacks/ema_weight_averaging.h"
#include "trainkit/train/callbacks/metrics_logger.h"
#include "trainkit/train/callbacks/stochastic_weight_averaging.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/trainer.h"
#if TRAINKIT_WITH_DISTRIBUTED
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/fully_shard.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/dist/zero.h"
#endif

namespace trainkit::app {

/// Raised for command-line misuse that is not a config key (e.g. a run directory that already holds a
/// run without --resume); apps exit with code 2, like for ConfigError.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// How build_run wires the run beyond the config.
struct RunOptions {
  /// Run directory for metrics.csv/jsonl, checkpoints/ and TensorBoard events (main rank only); empty =
  /// nothing is written and no logging or checkpoint callback is added.
  TORCH_ARG(std::string, dir) = "";
  /// Append to an existing metrics.csv (a resumed run).
  TORCH_ARG(bool, append_metrics) = false;
  /// Write TensorBoard events even when the config's log.tensorboard is false.
  TORCH_ARG(bool, tensorboard) = false;
  /// Console progress: "config" (log.progress), "bar" or "lines".
  TORCH_ARG(std::string, progress) = "config";
  /// Join the process group that `trainkit launch`/torchrun describe in the environment (WORLD_SIZE > 1):
  /// the training loader yields this rank's shard and the model is wrapped in DDP.
  TORCH_ARG(bool, distributed) = false;
};

/// A training run: its data (RunData: train/val/test batch sources, sizes, DataInfo) and its parts, ready
/// to use and owned here (the Trainer refers to the model and the optimizer, so a Run is moved, never copied).
struct Run : RunData {
  torch::Device device = torch::kCPU;
  int64_t rank = 0;        ///< this process's rank (0 when not distributed)
  int64_t world_size = 1;  ///< ranks in the job
  std::shared_ptr<torch::nn::Module> model;  ///< on `device`
  train::ForwardFn forward;  ///< the model's forward (without DDP's buffer broadcast; the Trainer's has it)
  train::LossFn loss;        ///< the model provider's loss; null = the Trainer's cross-entropy
  /// Shared: with `[zero] stage = 3` the FullyShardedDataParallel owns it.
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  std::optional<sched::BuiltScheduler> scheduler;  ///< built with the real steps per epoch
  int64_t steps_per_epoch = 0;                     ///< optimizer steps per epoch (accumulation included)
  std::unique_ptr<train::Trainer> trainer;         ///< with scheduler, clipping, AMP and callbacks attached
  std::shared_ptr<train::CheckpointManager> checkpoints;  ///< null without a run directory
  std::shared_ptr<log::MetricsWriter> metrics;            ///< main rank with a run directory
  std::shared_ptr<log::SummaryWriter> tensorboard;        ///< when TensorBoard is on
  std::shared_ptr<train::MetricsLogger> logging;          ///< main rank with a run directory
  /// When log.mlflow_uri is set (main rank with a run directory): every metrics row goes there too; the
  /// train job adds the artifacts and calls finish().
  std::shared_ptr<log::MlflowLogger> mlflow;
  std::shared_ptr<train::EMAWeightAveraging> ema;         ///< when ema.enabled
  std::shared_ptr<train::StochasticWeightAveraging> swa;  ///< when swa.enabled
#if TRAINKIT_WITH_DISTRIBUTED
  std::shared_ptr<dist::ProcessGroup> group;               ///< set when distributed
  std::unique_ptr<dist::DistributedDataParallel> ddp;     ///< set when distributed, below stage 3
  /// Set with `[zero] stage = 3` in a training job: the model's parameters sharded (one process: over a
  /// 1-rank group, so that more ranks can resume its checkpoints); it has its own DDP and optimizer.
  std::shared_ptr<dist::FullyShardedDataParallel> fsdp;
  /// `optimizer` itself with `[zero] stage` 1, 2 or 3 in a training job (each rank steps and saves its shard;
  /// one process keeps the state as a 1-rank shard, so that more ranks can resume it).
  dist::ZeroRedundancyOptimizer* zero = nullptr;
#endif
  /// True on the rank that logs and writes files.
  bool main_rank() const { return rank == 0; }
};

/// The device a process trains on, from train.device (`setting`), the launch (`world_size` ranks, this one
/// `local_rank` on its machine: torchrun's LOCAL_RANK) and the CUDA devices it sees: "cpu" → the CPU;
/// "cuda" → cuda:<local_rank> (one GPU per rank; cuda:0 for a single process); "cuda:<i>" → cuda:i, for a
/// single process only (every rank of a launch on one GPU would make NCCL fail); "auto" → as "cuda" when a
/// CUDA device is present, else the CPU. Throws ConfigError naming `source`, the setting and both numbers
/// when the device does not exist (no CUDA device, a local rank or index >= the device count). Pure.
torch::Device choose_device(const std::string& setting, int64_t world_size, int64_t local_rank,
                            int64_t cuda_devices, const std::string& source);

/// Loads the data (catalog's provider of data.dataset), seeds, builds the model (provider of model.name),
/// optimizer, scheduler and Trainer of `config` and attaches what the config asks for; errors name `source`
/// (the config file). Throws ConfigError, UsageError (e.g. CUDA requested but absent), data::DataError.
Run build_run(const Config& config, const std::string& source, const RunOptions& options = {},
              const Catalog& catalog = Catalog::builtin());

}  // namespace trainkit::app
