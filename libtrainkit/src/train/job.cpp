#include "trainkit/train/job.h"

#include <chrono>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "trainkit/amp/autocast.h"
#include "trainkit/amp/grad_scaler.h"
#include "trainkit/compat.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/features.h"
#if TRAINKIT_WITH_DISTRIBUTED
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/process_group.h"
#endif
#include "trainkit/log/metrics.h"
#include "trainkit/log/progress.h"
#include "trainkit/nn/models.h"
#include "trainkit/sched/factory.h"
#include "trainkit/train/callbacks.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/config.h"
#include "trainkit/train/trainer.h"

namespace trainkit::train {
namespace {

namespace fs = std::filesystem;

std::string default_run_dir(const std::string& config_path) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  return (fs::path("runs") / fmt::format("{}-{}", fs::path(config_path).stem().string(), stamp)).string();
}

torch::nn::Sequential make_model(const ModelConfig& m) {
  if (m.name == "mlp") {
    return nn::make_mlp(nn::MlpOptions().hidden({m.hidden}).dropout(m.dropout));
  }
  return nn::make_cnn(
      nn::CnnOptions().channels(m.channels).hidden(m.hidden).dropout(m.dropout).batch_norm(m.batch_norm));
}

/// Where the run goes and which checkpoint it resumes from; checks everything before anything is written.
struct RunPlan {
  std::string dir;
  std::string resume_from;  // empty: fresh run
};

RunPlan plan_run(const TrainJobOptions& options) {
  RunPlan plan;
  if (options.resume.empty() || options.resume == "auto") {
    plan.dir = options.out_dir.empty() ? default_run_dir(options.config_path) : options.out_dir;
  } else {
    if (!fs::is_regular_file(options.resume)) {
      throw UsageError(fmt::format("--resume {}: no such checkpoint file", options.resume));
    }
    const fs::path ckpt_dir = fs::path(options.resume).parent_path();
    plan.dir = options.out_dir.empty() ? (ckpt_dir.has_parent_path() ? ckpt_dir.parent_path().string() : ".")
                                       : options.out_dir;
    plan.resume_from = options.resume;
  }
  const CheckpointManager manager((fs::path(plan.dir) / "checkpoints").string(), 1);
  const auto existing = manager.list();
  if (options.resume == "auto") {
    if (options.out_dir.empty()) {
      throw UsageError("--resume auto needs --out DIR (the run directory to continue)");
    }
  } else if (options.resume.empty() && !existing.empty()) {
    throw UsageError(fmt::format("{} already holds a run ({} checkpoints); pass --resume auto to continue it "
                                 "or choose another --out",
                                 plan.dir, existing.size()));
  }
  return plan;
}

data::ImageSet slice(const data::ImageSet& s, int64_t start, int64_t len) {
  return {s.images.narrow(0, start, len), s.labels.narrow(0, start, len)};
}

}  // namespace

RunSetup build_run_setup(const TrainConfig& config, const std::string& source, int64_t num_replicas,
                         int64_t rank) {
  RunSetup setup;
  if (config.train.device == "cuda") {
    if (!torch::cuda::is_available()) {
      throw ConfigError(fmt::format("{}: train.device = \"cuda\" but no CUDA device is available", source));
    }
    setup.device = torch::Device(torch::kCUDA);
  }
  if (config.train.threads > 0) {
    torch::set_num_threads(static_cast<int>(config.train.threads));
  }
  const data::ImageSet full_train = data::load_mnist_split(config.data.dir, true, config.data.limit_train);
  const data::ImageSet test = data::load_mnist_split(config.data.dir, false, config.data.limit_test);
  const int64_t n_all = full_train.images.size(0);
  if (config.data.val_size >= n_all) {
    throw ConfigError(fmt::format("{}: data.val_size ({}) must be smaller than the {} training examples", source,
                                  config.data.val_size, n_all));
  }
  const int64_t n_train = n_all - config.data.val_size;
  const torch::Device device = setup.device;
  const auto to_device = [&device](const data::ImageSet& s) {
    return data::ImageSet{s.images.to(device), s.labels.to(device)};
  };
  const data::ImageSet train_set = to_device(slice(full_train, 0, n_train));
  setup.train = std::make_unique<data::TensorLoader>(train_set.images, train_set.labels,
                                                     data::TensorLoaderOptions()
                                                         .batch_size(config.train.batch_size)
                                                         .shuffle(true)
                                                         .seed(static_cast<uint64_t>(config.train.seed))
                                                         .num_replicas(num_replicas)
                                                         .rank(rank));
  if (config.data.val_size > 0) {
    const data::ImageSet val_set = to_device(slice(full_train, n_train, config.data.val_size));
    setup.val = std::make_unique<data::TensorLoader>(
        val_set.images, val_set.labels,
        data::TensorLoaderOptions().batch_size(config.train.eval_batch_size).shuffle(false));
  }
  const data::ImageSet test_set = to_device(test);
  setup.test = std::make_unique<data::TensorLoader>(
      test_set.images, test_set.labels, data::TensorLoaderOptions().batch_size(config.train.eval_batch_size).shuffle(false));
  torch::manual_seed(static_cast<uint64_t>(config.train.seed));
  setup.model = make_model(config.model);
  setup.model->to(device);
  setup.optimizer = make_optimizer(config.optimizer, setup.model->parameters());
  return setup;
}

TrainJobResult run_train_job(const TrainJobOptions& options) {
  const auto wall_start = std::chrono::steady_clock::now();
  const TrainConfig config = load_config(options.config_path, options.overrides);
  const RunPlan plan = plan_run(options);

  // Under `trainkit launch` or torchrun: one process group, each rank trains on its shard through DDP, and
  // only rank 0 logs and writes the run directory. Alone: world size 1, none of that.
  int64_t rank = 0;
  int64_t world = 1;
#if TRAINKIT_WITH_DISTRIBUTED
  std::shared_ptr<dist::ProcessGroup> group;
  try {
    auto dist_options = dist::options_from_env();
    if (dist_options.world_size() > 1) {
      dist_options.backend(config.distributed.backend)
          .timeout(std::chrono::milliseconds(static_cast<int64_t>(config.distributed.timeout * 1000.0)));
      group = dist::ProcessGroup::init(dist_options);
      rank = group->rank();
      world = group->world_size();
    }
  } catch (const dist::DistError& e) {
    throw UsageError(e.what());
  }
#else
  if (std::getenv("WORLD_SIZE") != nullptr && std::string(std::getenv("WORLD_SIZE")) != "1") {
    throw UsageError("WORLD_SIZE is set but this trainkit was built without TRAINKIT_WITH_DISTRIBUTED");
  }
#endif
  const bool main_rank = rank == 0;
  if (!main_rank) {
    spdlog::set_level(spdlog::level::warn);  // rank 0 reports
  }

  RunSetup setup = build_run_setup(config, options.config_path, world, rank);
  const torch::Device device = setup.device;
  data::TensorLoader& train_loader = *setup.train;
  const data::TensorLoader* val_loader = setup.val.get();
  const data::TensorLoader& test_loader = *setup.test;
  torch::nn::Sequential model = setup.model;
  torch::optim::Optimizer* const optimizer = setup.optimizer.get();
  const int64_t n_train = train_loader.size();
  Trainer trainer(model, *optimizer,
                  TrainerOptions()
                      .epochs(config.train.epochs)
                      .max_steps(config.train.max_steps)
                      .accumulation_steps(config.grad.accumulation_steps)
                      .clip_grad_norm(config.grad.clip_norm)
                      .norm_type(config.grad.norm_type)
                      .clip_grad_value(config.grad.clip_value));
  const int64_t steps_per_epoch =
      (train_loader.num_batches() + config.grad.accumulation_steps - 1) / config.grad.accumulation_steps;
  if (config.amp.enabled) {
    const auto dtype = config.amp.dtype == "float16" ? torch::kFloat16 : torch::kBFloat16;
    if (!amp::is_autocast_dtype_supported(device.type(), dtype)) {
      throw ConfigError(fmt::format("{}: amp.dtype = \"{}\" autocast is not supported on {}", options.config_path,
                                    config.amp.dtype, device.str()));
    }
    trainer.set_autocast(device.type(), dtype);
  }
  if (config.amp.grad_scaler) {
    trainer.set_grad_scaler(std::make_shared<amp::GradScaler>(
        device, amp::GradScalerOptions()
                    .init_scale(config.amp.init_scale)
                    .growth_interval(config.amp.growth_interval)));
  }
  if (!config.scheduler.empty()) {
    try {
      auto built = sched::make_scheduler(config.scheduler, *optimizer, options.config_path + ": [scheduler]",
                                         sched::SchedulerContext{config.train.epochs, steps_per_epoch});
      spdlog::info("scheduler {} stepped per {}", built.scheduler->name(), built.interval);
      trainer.set_scheduler(built.scheduler, built.interval == "step");
    } catch (const std::invalid_argument& e) {
      throw ConfigError(e.what());
    }
  }

#if TRAINKIT_WITH_DISTRIBUTED
  // Built before any resume: the broadcast from rank 0 happens here, and every rank then loads the same
  // checkpoint, so parameters and optimizer states agree.
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (group) {
    ddp = std::make_unique<dist::DistributedDataParallel>(
        model.ptr(), group, dist::DistributedDataParallelOptions().bucket_cap_mb(config.distributed.bucket_cap_mb));
    spdlog::info("distributed: {} ranks, backend {}, {} gradient buckets", world, group->backend_name(device),
                 ddp->bucket_indices().size());
  }
#endif
  auto manager = std::make_shared<CheckpointManager>((fs::path(plan.dir) / "checkpoints").string(),
                                                     config.checkpoint.keep_last);
  bool resumed = false;
  const auto restore = [&trainer, &resumed](const std::string& path, torch::serialize::InputArchive& archive) {
    try {
      trainer.load(archive);
    } catch (const c10::Error& e) {
      throw CheckpointError(fmt::format("{}: does not match this config's model or optimizer: {}", path,
                                        e.what_without_backtrace()));
    }
    resumed = true;
    spdlog::info("resumed from {} at epoch {}, step {}", path, trainer.state().epoch + 1, trainer.state().step);
  };
  if (!plan.resume_from.empty()) {
    torch::serialize::InputArchive archive;
    load_checkpoint(plan.resume_from, archive);
    restore(plan.resume_from, archive);
  } else if (options.resume == "auto") {
    torch::serialize::InputArchive archive;
    if (const auto path = manager->load_latest(archive)) {
      restore(*path, archive);
    } else {
      spdlog::info("--resume auto: no usable checkpoint in {}, starting fresh", manager->dir());
    }
  }

  std::shared_ptr<log::MetricsWriter> metrics;
  std::shared_ptr<log::SummaryWriter> tensorboard;
  std::shared_ptr<LoggingCallback> logging;
  if (main_rank) {
    fs::create_directories(plan.dir);
    write_file_atomic((fs::path(plan.dir) / "config.toml").string(), to_toml(config));
    metrics = std::make_shared<log::MetricsWriter>(plan.dir, resumed);
    const bool bar = config.log.progress == "bar" || (config.log.progress == "auto" && log::is_terminal(stderr));
    if (config.log.tensorboard) {
      tensorboard = std::make_shared<log::SummaryWriter>(plan.dir);
    }
    logging = std::make_shared<LoggingCallback>(metrics, config.log.every_steps, bar, tensorboard);
    trainer.add_callback(logging);
    trainer.add_callback(std::make_shared<CheckpointCallback>(manager, config.checkpoint.every_steps));
  }

  spdlog::info("training {} on {} ({} train, {} val, {} test examples) with {}, run directory {}",
               config.model.name, device.str(), n_train, config.data.val_size, test_loader.size(),
               config.optimizer.name, plan.dir);
  trainer.fit(train_loader, val_loader);

  const EvalResult test_result = trainer.evaluate(test_loader);
  TrainJobResult result;
  result.run_dir = plan.dir;
  result.test_accuracy = test_result.accuracy;
  result.test_loss = test_result.loss;
  result.epochs = trainer.state().epoch;
  result.steps = trainer.state().step;
  result.finished = trainer.state().epoch >= config.train.epochs;
  result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  if (!main_rank) {
    return result;  // rank 0 writes the run directory
  }
  // Rank 0 counts its own shard; every rank trains as many samples, so the job's rate is world times that.
  result.train_samples_per_second =
      logging->train_seconds() > 0
          ? static_cast<double>(world) * static_cast<double>(logging->samples_trained()) / logging->train_seconds()
          : 0.0;

  log::MetricRow row;
  row.kind = "test";
  row.step = result.steps;
  row.epoch = result.epochs;
  row.val_loss = result.test_loss;
  row.val_accuracy = result.test_accuracy;
  metrics->write(row);
  if (tensorboard) {
    tensorboard->add_scalar("test/accuracy", result.test_accuracy, result.steps);
    tensorboard->add_scalar("test/loss", result.test_loss, result.steps);
    tensorboard->close();
  }
  log::write_curves_svg((fs::path(plan.dir) / "metrics.csv").string(), (fs::path(plan.dir) / "curves.svg").string(),
                        fs::path(options.config_path).stem().string());
  write_file_atomic((fs::path(plan.dir) / "summary.json").string(),
                    fmt::format("{{\n  \"test_accuracy\": {:.6f},\n  \"test_loss\": {:.6f},\n  \"epochs\": {},\n"
                                "  \"steps\": {},\n  \"finished\": {},\n  \"wall_seconds\": {:.3f},\n"
                                "  \"train_samples_per_second\": {:.1f},\n  \"torch_version\": \"{}\"\n}}\n",
                                result.test_accuracy, result.test_loss, result.epochs, result.steps,
                                result.finished ? "true" : "false", result.wall_seconds,
                                result.train_samples_per_second, compat::torch_version()));
  spdlog::info("test accuracy {:.4f}, test loss {:.4f} after {} epochs ({} steps) in {:.1f} s; {}",
               result.test_accuracy, result.test_loss, result.epochs, result.steps, result.wall_seconds,
               plan.dir);
  return result;
}

}  // namespace trainkit::train

namespace trainkit::train {

LrFindJobResult run_lr_find_job(const LrFindJobOptions& options) {
  const TrainConfig config = load_config(options.config_path, options.overrides);
  if (options.use_val && config.data.val_size == 0) {
    throw ConfigError(options.config_path + ": --val needs data.val_size > 0");
  }
  RunSetup setup = build_run_setup(config, options.config_path);
  torch::nn::Sequential model = setup.model;
  tune::LRFinder finder(model.ptr(), [model](const at::Tensor& x) mutable { return model->forward(x); },
                        *setup.optimizer);
  spdlog::info("LR range test: {} to {} over {} steps ({}), batch {}", options.finder.start_lr(),
               options.finder.end_lr(), options.finder.num_iter(), options.finder.step_mode(), config.train.batch_size);
  LrFindJobResult result;
  result.curve = finder.range_test(*setup.train, options.use_val ? setup.val.get() : nullptr, options.finder);
  if (result.curve.diverged) {
    spdlog::info("stopped early at lr {:.3g}: the loss diverged", result.curve.lrs.back());
  }
  using Suggest = std::function<std::optional<tune::Suggestion>(const tune::LRFinderResult&, std::string*)>;
  const std::vector<Suggest> methods = {
      [](const tune::LRFinderResult& r, std::string* why) { return tune::suggest_steepest(r, why); },
      tune::suggest_valley, tune::suggest_minimum};
  for (const auto& suggest : methods) {
    std::string why;
    if (auto s = suggest(result.curve, &why)) {
      spdlog::info("suggested lr ({}): {:.3g}", s->method, s->lr);
      result.suggestions.push_back(*s);
    } else {
      spdlog::warn("no suggestion: {}", why);
    }
  }
  std::filesystem::create_directories(options.out_dir);
  const std::string csv = (std::filesystem::path(options.out_dir) / "lr_find.csv").string();
  const std::string svg = (std::filesystem::path(options.out_dir) / "lr_find.svg").string();
  tune::write_lr_finder_csv(result.curve, csv);
  tune::write_lr_finder_svg(result.curve, result.suggestions, svg,
                            fmt::format("LR range test ({})", options.config_path));
  spdlog::info("wrote {} and {}", csv, svg);
  return result;
}

tune::BatchSizeFinderResult run_batch_size_job(const BatchSizeJobOptions& options) {
  const TrainConfig config = load_config(options.config_path, options.overrides);
  RunSetup setup = build_run_setup(config, options.config_path);
  // The finder slices the samples itself, so it takes the training split as tensors.
  const data::ImageSet all = data::load_mnist_split(config.data.dir, true, config.data.limit_train);
  const int64_t n_train = all.images.size(0) - config.data.val_size;
  const at::Tensor x = all.images.narrow(0, 0, n_train).to(setup.device);
  const at::Tensor y = all.labels.narrow(0, 0, n_train).to(setup.device);
  torch::nn::Sequential model = setup.model;
  tune::BatchSizeFinder finder(model.ptr(), [model](const at::Tensor& in) mutable { return model->forward(in); },
                               *setup.optimizer);
  tune::BatchSizeFinderOptions finder_options = options.finder;
  if (setup.device.is_cuda()) {
    finder_options.memory_budget(0);
  }
  spdlog::info("batch-size finder ({}) on {} training samples, {} steps per trial, from {}{}", finder_options.mode(),
               n_train, finder_options.steps_per_trial(), finder_options.init_val(),
               finder_options.memory_budget() > 0
                   ? fmt::format(", CPU budget {:.0f} MiB", static_cast<double>(finder_options.memory_budget()) / 1048576.0)
                   : "");
  const tune::BatchSizeFinderResult result = finder.scale_batch_size(x, y, finder_options);
  for (const auto& t : result.trials) {
    spdlog::info("batch size {:>6}: {}, {:.0f} samples/s{}{}", t.batch_size, t.fits ? "fits" : "fails",
                 t.samples_per_second,
                 t.peak_bytes >= 0 ? fmt::format(", peak +{:.1f} MiB", static_cast<double>(t.peak_bytes) / 1048576.0) : "",
                 t.fits ? "" : " (" + t.failure + ")");
  }
  spdlog::info("batch size found ({}): {}", result.mode, result.batch_size);
  return result;
}

}  // namespace trainkit::train
