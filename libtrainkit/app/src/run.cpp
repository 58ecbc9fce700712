#include "trainkit/app/run.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include "trainkit/amp/autocast.h"
#include "trainkit/app/toml_args.h"
#include "trainkit/compat.h"
#include "trainkit/amp/grad_scaler.h"
#include "trainkit/log/progress.h"
#include "trainkit/nn/init.h"
#include "trainkit/nn/script_module.h"
#include "trainkit/optim/offload.h"
#include "trainkit/train/callbacks/early_stopping.h"
#include "trainkit/train/callbacks/model_checkpoint.h"
#include "trainkit/train/callbacks/norm_monitor.h"
#include "trainkit/train/callbacks/profiler_trace.h"
#include "trainkit/train/callbacks/trainer_checkpoint.h"
#include "trainkit/train/host_memory.h"
#include "trainkit/version.h"
#if TRAINKIT_WITH_DISTRIBUTED
#include "trainkit/dist/checkpoint_group.h"
#endif

namespace trainkit::app {
namespace {

/// The config's optimizer over the model: one group, the no-decay split (optimizer.no_decay_1d), one group per
/// layer and decay (optimizer.layer_decay, layers by optim::child_layer_ids), or groups by parameter name
/// with their own LRs (optimizer.lr_by_name, with the no-decay split inside each group when no_decay_1d).
std::unique_ptr<torch::optim::Optimizer> make_run_optimizer(const Run& run, const Config& config,
                                                            const std::string& source) {
  const optim::OptimizerSpec& spec = config.optimizer;
  const bool by_name = !spec.lr_by_name.empty();
  if (spec.layer_decay == 0 && !by_name) {
    return optim::make_optimizer(spec, run.model->parameters());
  }
  const char* key = by_name ? "lr_by_name" : "layer_decay";
  // Schedulers that set every group to one absolute LR would undo the groups' own LRs.
  if (config.scheduler && (config.scheduler->type == "OneCycleLR" || config.scheduler->type == "CyclicLR")) {
    throw ConfigError(fmt::format("{}: optimizer.{} gives the param groups their own LRs, but scheduler {} sets "
                                  "every group to its own max_lr; use a scheduler that scales the LR (e.g. "
                                  "WarmupCosine, CosineAnnealingLR) or leave optimizer.{} out",
                                  source, key, config.scheduler->type, key));
  }
  const ArgTable args = optim::optimizer_args(spec);
  const ArgValue* wd = find_arg(args, "weight_decay");
  const double weight_decay = wd != nullptr ? *wd->as_number() : 0.0;
  if (by_name) {
    std::vector<optim::LayerDecayGroup> groups;
    try {
      groups = optim::lr_groups(run.model->named_parameters(), spec.lr_by_name,
                                optim::LrGroupsOptions().weight_decay(weight_decay).exclude_1d(spec.no_decay_1d));
    } catch (const std::invalid_argument& e) {
      throw ConfigError(fmt::format("{}: optimizer.lr_by_name: {}", source, e.what()));
    }
    for (const auto& g : groups) {
      spdlog::info("optimizer: group {} lr {} ({} tensors)", g.name,
                   g.lr ? fmt::format("{:g}", *g.lr) : std::string("as optimizer.lr"), g.params.size());
    }
    return optim::make_optimizer(spec, groups);
  }
  const auto groups = optim::layer_decay_groups(run.model->named_parameters(), optim::child_layer_ids(*run.model),
                                                optim::LayerDecayOptions().layer_decay(spec.layer_decay).weight_decay(weight_decay));
  spdlog::info("optimizer: layer_decay {}, {} param groups (lowest LR scale {:.4g})", spec.layer_decay,
               groups.size(), groups.empty() ? 1.0 : groups.front().lr_scale);
  return optim::make_optimizer(spec, groups);
}

/// (WORLD_SIZE, LOCAL_RANK) of this process when it was started by a launcher and `distributed` runs are
/// allowed, else (1, 0).
std::pair<int64_t, int64_t> launch_position(bool distributed) {
  if (!distributed) {
    return {1, 0};
  }
#if TRAINKIT_WITH_DISTRIBUTED
  try {
    const auto env = dist::options_from_env();
    return {env.world_size(), env.local_rank()};
  } catch (const dist::DistError& e) {
    throw UsageError(e.what());
  }
#else
  return {1, 0};
#endif
}

/// Joins the process group described by the environment when WORLD_SIZE > 1.
void join_group(Run& run, const Config& config) {
#if TRAINKIT_WITH_DISTRIBUTED
  try {
    auto options = dist::options_from_env();
    if (options.world_size() > 1) {
      options.backend(config.distributed.group.backend()).timeout(config.distributed.group.timeout());
      run.group = dist::ProcessGroup::init(options);
      run.rank = run.group->rank();
      run.world_size = run.group->world_size();
      if (run.rank != 0) {
        spdlog::set_level(spdlog::level::warn);  // rank 0 reports
      }
    }
  } catch (const dist::DistError& e) {
    throw UsageError(e.what());
  }
#else
  (void)run;
  (void)config;
  if (std::getenv("WORLD_SIZE") != nullptr && std::string(std::getenv("WORLD_SIZE")) != "1") {
    throw UsageError("WORLD_SIZE is set but this trainkit was built without TRAINKIT_WITH_DISTRIBUTED");
  }
#endif
}

/// Metrics and what a metric-driven scheduler watches, checked against what the run measures.
void attach_metrics(Run& run, const Config& config, const std::string& source) {
  std::vector<std::shared_ptr<train::Metric>> metrics;
  for (const auto& name : config.train.metrics) {
    metrics.push_back(train::make_metric(name));
  }
  run.trainer->set_metrics(std::move(metrics));
  if (!config.log.time_to_accuracy.empty()) {
    const auto& m = config.train.metrics;
    if (std::find(m.begin(), m.end(), "accuracy") == m.end()) {
      throw ConfigError(fmt::format("{}: log.time_to_accuracy times validation accuracy, but train.metrics does not "
                                    "measure \"accuracy\"", source));
    }
    if (run.val == nullptr) {
      throw ConfigError(fmt::format("{}: log.time_to_accuracy needs a validation set (data.val_size > 0)", source));
    }
  }
  const std::string& monitor = config.train.monitor;
  if (monitor.rfind("val/", 0) == 0) {
    const std::string name = monitor.substr(4);
    const auto& m = config.train.metrics;
    if (name != "loss" && std::find(m.begin(), m.end(), name) == m.end()) {
      throw ConfigError(fmt::format("{}: train.monitor = \"{}\" but train.metrics does not measure \"{}\"", source,
                                    monitor, name));
    }
    if (name != "loss" && run.val == nullptr) {
      throw ConfigError(fmt::format("{}: train.monitor = \"{}\" needs a validation set (data.val_size > 0)", source,
                                    monitor));
    }
  }
}

void attach_precision(Run& run, const Config& config, const std::string& source) {
  if (config.amp.enabled) {
    const auto dtype = config.amp.dtype == "float16" ? torch::kFloat16 : torch::kBFloat16;
    if (!amp::is_autocast_dtype_supported(run.device.type(), dtype)) {
      throw ConfigError(fmt::format("{}: amp.dtype = \"{}\" autocast is not supported on {}", source,
                                    config.amp.dtype, run.device.str()));
    }
    run.trainer->set_autocast(run.device.type(), dtype);
  }
  if (config.amp.grad_scaler) {
    run.trainer->set_grad_scaler(std::make_shared<amp::GradScaler>(run.device, config.amp.scaler));
  }
}

/// The hooks whose state is in checkpoints: added before TrainerCheckpoint, so that a checkpoint holds
/// their update of the same step or epoch.
void attach_hooks(Run& run, const Config& config, const RunOptions& options, const std::string& source) {
  const auto check_monitor = [&](const std::string& key, const std::string& monitor) {
    if (monitor.rfind("val", 0) == 0 && run.val == nullptr) {
      throw ConfigError(fmt::format("{}: {} = \"{}\" needs a validation set (data.val_size > 0)", source, key,
                                    monitor));
    }
    if (monitor.rfind("val_ema/", 0) == 0 && !config.ema.enabled) {
      throw ConfigError(fmt::format("{}: {} = \"{}\" needs ema.enabled = true", source, key, monitor));
    }
  };
  if (config.ema.enabled) {
    run.ema = std::make_shared<train::EMAWeightAveraging>(*run.model, config.ema.options);
    run.trainer->add_callback(run.ema);
  }
  if (config.swa.enabled) {
    run.swa = std::make_shared<train::StochasticWeightAveraging>(*run.model, *run.optimizer, config.swa.options);
    run.trainer->add_callback(run.swa);
  }
  if (config.early_stopping.enabled) {
    check_monitor("early_stopping.monitor", config.early_stopping.options.monitor());
    run.trainer->add_callback(std::make_shared<train::EarlyStopping>(config.early_stopping.options));
  }
  if (config.checkpoint.best.save_top_k() != 0 && !options.dir().empty() && run.main_rank()) {
    check_monitor("checkpoint.monitor", config.checkpoint.best.monitor());
    run.trainer->add_callback(std::make_shared<train::ModelCheckpoint>(
        train::ModelCheckpointOptions(config.checkpoint.best)
            .dir((std::filesystem::path(options.dir()) / "best").string())
            .export_formats(config.checkpoint.export_formats)));
  }
}

std::string first_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

/// The commit checked out in the git work tree around the working directory, or "" (not in one, or
/// unreadable). Read from .git directly: HEAD, then the branch's ref file or packed-refs.
std::string git_commit() {
  std::error_code ec;
  for (std::filesystem::path dir = std::filesystem::current_path(ec); !ec && !dir.empty(); dir = dir.parent_path()) {
    const std::filesystem::path git = dir / ".git";
    if (std::filesystem::is_directory(git, ec)) {
      const std::string head = first_line(git / "HEAD");
      if (head.rfind("ref: ", 0) != 0) return head;
      const std::string ref = head.substr(5);
      if (std::string commit = first_line(git / ref); !commit.empty()) return commit;
      std::ifstream packed(git / "packed-refs");
      for (std::string line; std::getline(packed, line);) {
        if (line.size() > 41 && line.compare(41, std::string::npos, ref) == 0) return line.substr(0, 40);
      }
      return "";
    }
    if (dir == dir.parent_path()) break;
  }
  return "";
}

/// `table` as "section.key" = value pairs, strings without their quotes (MLflow params).
void flatten(const ArgTable& table, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  for (const auto& [key, value] : table) {
    if (const auto* sub = value.get_if<ArgTable>()) {
      flatten(*sub, prefix + key + ".", out);
    } else if (const auto* text = value.get_if<std::string>()) {
      out.emplace_back(prefix + key, *text);
    } else {
      out.emplace_back(prefix + key, value.to_string());
    }
  }
}

/// The MLflow logger of a run directory: a new MLflow run, or the one noted in <dir>/mlflow_run_id when the
/// run resumes; params (the effective config), tags (versions, world size, git commit).
std::shared_ptr<log::MlflowLogger> start_mlflow(const Config& config, const RunOptions& options, int64_t world_size) {
  const std::filesystem::path dir = std::filesystem::absolute(options.dir()).lexically_normal();
  const std::filesystem::path id_file = dir / "mlflow_run_id";
  log::MlflowLoggerOptions o;
  o.tracking_uri = config.log.mlflow_uri;
  o.experiment = config.log.mlflow_experiment;
  o.run_name = config.log.mlflow_run_name;
  if (o.run_name.empty()) {
    o.run_name = (dir.has_filename() ? dir : dir.parent_path()).filename().string();
  }
  const std::string resume_id = options.append_metrics() ? first_line(id_file) : "";
  o.resume_run_id = resume_id;
  o.on_run = [id_file](const log::MlflowRunInfo& info) {
    train::write_file_atomic(id_file.string(), info.run_id + "\n");
  };
  auto logger = std::make_shared<log::MlflowLogger>(std::move(o));
  std::vector<std::pair<std::string, std::string>> params;
  flatten(parse_toml(to_toml(config), "the effective config"), "", params);
  logger->log_params(std::move(params));
  std::vector<std::pair<std::string, std::string>> tags = {
      {"trainkit.version", TRAINKIT_VERSION},
      {"trainkit.torch_version", compat::torch_version()},
      {"trainkit.world_size", std::to_string(world_size)},
      {"trainkit.run_dir", dir.string()}};
  if (const std::string commit = git_commit(); !commit.empty()) {
    tags.emplace_back("mlflow.source.git.commit", commit);
  }
  logger->set_tags(std::move(tags));
  spdlog::info("MLflow: logging to {} (experiment \"{}\"{})", log::mlflow_redacted_uri(config.log.mlflow_uri),
               config.log.mlflow_experiment,
               resume_id.empty() ? "" : ", continuing run " + resume_id);
  return logger;
}

void attach_outputs(Run& run, const Config& config, const RunOptions& options) {
  if (options.dir().empty()) {
    return;
  }
  run.checkpoints = std::make_shared<train::CheckpointManager>(
      (std::filesystem::path(options.dir()) / "checkpoints").string(), config.checkpoint.keep_last);
#if TRAINKIT_WITH_DISTRIBUTED
  if (run.zero != nullptr && run.group) {
    // Every rank saves its shard at the same steps; rank 0 commits each step once all are durable.
    run.checkpoints->set_sharded(dist::checkpoint_group(run.group));
    if (!run.main_rank()) {
      run.trainer->add_callback(
          std::make_shared<train::TrainerCheckpoint>(run.checkpoints, config.checkpoint.every_steps));
    }
  }
#endif
  if (!run.main_rank()) {
    return;
  }
  std::filesystem::create_directories(options.dir());
  std::vector<std::string> columns = train::MetricsLogger::monitor_columns(*run.optimizer, config.trainer.clip_grad_norm() > 0);
  if (config.ema.enabled && run.val != nullptr) {  // the EMA weights' validation, in every epoch row
    columns.emplace_back("val_ema/loss");
    for (const std::string& metric : config.train.metrics) {
      columns.push_back("val_ema/" + metric);
    }
  }
  run.metrics = std::make_shared<log::MetricsWriter>(options.dir(), options.append_metrics(), config.train.metrics,
                                                     std::move(columns));
  const std::string progress = options.progress() == "config" ? config.log.progress : options.progress();
  const bool bar = progress == "bar" || (progress == "auto" && log::is_terminal(stderr));
  if (config.log.tensorboard || options.tensorboard()) {
    run.tensorboard = std::make_shared<log::SummaryWriter>(options.dir());
  }
  run.logging = std::make_shared<train::MetricsLogger>(run.metrics, config.log.every_steps, bar, run.tensorboard);
  run.trainer->add_callback(run.logging);
  if (!config.log.mlflow_uri.empty()) {
    run.mlflow = start_mlflow(config, options, run.world_size);
    run.metrics->add_sink([mlflow = run.mlflow](const log::MetricRow& row) {
      mlflow->log_metrics(log::mlflow_metrics(row));
    });
  }
  if (config.log.layer_norms) {
    run.trainer->add_callback(std::make_shared<train::NormMonitor>(
        *run.model,
        train::NormMonitorOptions()
            .every_steps(config.log.every_steps)
            .csv_path((std::filesystem::path(options.dir()) / "layer_norms.csv").string())
            .append(options.append_metrics()),
        run.tensorboard));
  }
  run.trainer->add_callback(
      std::make_shared<train::TrainerCheckpoint>(run.checkpoints, config.checkpoint.every_steps));
  if (config.profile.trace_steps > 0) {
    run.trainer->add_callback(std::make_shared<train::ProfilerTrace>(
        train::ProfilerTraceOptions(config.profile.trace)
            .path((std::filesystem::path(options.dir()) / "trace.json").string())
            .active(config.profile.trace_steps)));
  }
}

#if TRAINKIT_WITH_DISTRIBUTED
/// What `[zero] stage = 3` needs: a model whose units trainkit knows, and no hook that reads every parameter
/// on every rank (a rank holds only the parameters it owns between the units' passes).
void check_fully_shardable(const Config& config, const ModelParts& parts, const std::string& source) {
  const auto refuse = [&](const std::string& what) {
    throw ConfigError(fmt::format("{}: [zero] stage = 3 shards the parameters (each rank holds its own between the "
                                  "units' passes), {}",
                                  source, what));
  };
  if (!parts.sequential) {
    refuse(fmt::format("which needs a model of Sequential units (model.name = \"cnn\", \"mlp\", \"resnet\" or "
                       "\"resnet18\"); model.name = \"{}\" is not one: use stage 2",
                       config.model.name));
  }
  if (config.model.checkpoint_segments > 0) {
    refuse("and already recomputes every unit in backward: leave model.checkpoint_segments out");
  }
  if (config.ema.enabled || config.swa.enabled) {
    refuse(fmt::format("but {} averages every parameter on every rank: use stage 2",
                       config.ema.enabled ? "ema.enabled" : "swa.enabled"));
  }
  if (config.log.layer_norms) refuse("but log.layer_norms reads every parameter on every rank: use stage 2");
  if (config.checkpoint.best.save_top_k() != 0) {
    refuse("but checkpoint.save_top_k writes whole models during training: use stage 2 (the final weights are "
           "exported whole at stage 3 too)");
  }
}
#endif

}  // namespace

torch::Device choose_device(const std::string& setting, int64_t world_size, int64_t local_rank,
                            int64_t cuda_devices, const std::string& source) {
  if (c10::is_privateuse1_backend_registered() && setting.rfind(c10::get_privateuse1_backend(), 0) == 0) {
    // An out-of-tree backend's device, as it names itself ("<name>" or "<name>:<index>").
    const torch::Device device(setting);
    const int64_t count = at::globalContext().getAcceleratorHooksInterface(c10::DeviceType::PrivateUse1).deviceCount();
    const int64_t index = device.has_index() ? device.index() : (world_size > 1 ? local_rank : 0);
    if (index >= count) {
      throw ConfigError(fmt::format("{}: train.device = \"{}\" but this process has {} {} device{}", source, setting,
                                    count, c10::get_privateuse1_backend(), count == 1 ? "" : "s"));
    }
    return {c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)};
  }
  if (setting == "cpu" || (setting == "auto" && cuda_devices == 0)) {
    return torch::kCPU;
  }
  if (cuda_devices == 0) {
    throw ConfigError(fmt::format("{}: train.device = \"{}\" but no CUDA device is available", source, setting));
  }
  if (setting == "cuda" || setting == "auto") {
    const int64_t index = world_size > 1 ? local_rank : 0;
    if (index >= cuda_devices) {
      throw ConfigError(fmt::format(
          "{}: train.device = \"{}\" puts each rank on cuda:<LOCAL_RANK>, but LOCAL_RANK is {} and this machine has {} "
          "CUDA device{} (start at most {} rank{} per machine)",
          source, setting, local_rank, cuda_devices, cuda_devices == 1 ? "" : "s", cuda_devices,
          cuda_devices == 1 ? "" : "s"));
    }
    return {torch::kCUDA, static_cast<c10::DeviceIndex>(index)};
  }
  const int64_t index = std::stoll(setting.substr(5));  // "cuda:<index>", checked by the config reader
  if (world_size > 1) {
    throw ConfigError(fmt::format("{}: train.device = \"{}\" would put all {} ranks on one GPU; use \"cuda\" (rank r "
                                  "of a machine on cuda:r)", source, setting, world_size));
  }
  if (index >= cuda_devices) {
    throw ConfigError(fmt::format("{}: train.device = \"{}\" but this machine has {} CUDA device{} (cuda:0 .. cuda:{})",
                                  source, setting, cuda_devices, cuda_devices == 1 ? "" : "s", cuda_devices - 1));
  }
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(index)};
}

Run build_run(const Config& config, const std::string& source, const RunOptions& options, const Catalog& catalog) {
  Run run;
  const auto [world_size, local_rank] = launch_position(options.distributed());
  run.device = choose_device(config.train.device, world_size, local_rank,
                             config.train.device == "cpu" ? 0 : static_cast<int64_t>(torch::cuda::device_count()), source);
  if (!run.device.is_cpu()) {
    // The current device of this process (NCCL's communicators and every unqualified "cuda" allocation).
    c10::impl::getDeviceGuardImpl(run.device.type())->setDevice(run.device);
  }
  if (config.train.threads > 0) {
    torch::set_num_threads(static_cast<int>(config.train.threads));
  }
  if (options.distributed()) {
    join_group(run, config);  // first: ranks other than 0 log only warnings from here on
  }
  if (config.train.device == "auto") {
    spdlog::info("train.device = \"auto\": training on {}{}", run.device.str(),
                 run.device.is_cuda() ? "" : " (no CUDA device available)");
  }
  const DataRequest request{config, source, run.device, run.rank, run.world_size};
  static_cast<RunData&>(run) = catalog.data(config.data.dataset, source).load(request);
  // After loading: the loader's one-off buffers go back to the system, the cache keeps what steps reuse.
  if (config.train.host_cache && !train::enable_host_caching_allocator()) {
    spdlog::warn("train.host_cache: another CPU allocator is installed with a higher priority; it stays");
  }
  torch::manual_seed(static_cast<uint64_t>(config.train.seed));
  ModelParts parts = catalog.model(config.model.name, source).build(config, run.info, source);
  run.model = std::move(parts.module);
  const auto& formats = config.checkpoint.export_formats;
  if (std::find(formats.begin(), formats.end(), "torchscript") != formats.end() &&
      std::dynamic_pointer_cast<nn::ScriptModuleImpl>(run.model) == nullptr) {
    throw ConfigError(fmt::format("{}: checkpoint.export = [..., \"torchscript\"] writes whole TorchScript models, "
                                  "which needs model.name = \"torchscript\" (this run's model is \"{}\")",
                                  source, config.model.name));
  }
  nn::init::apply(*run.model, nn::init::scheme(config.model.init));
  run.model->to(run.device);
  run.forward = parts.forward;
  if (config.train.label_smoothing > 0.0) {
    if (parts.loss) {
      throw ConfigError(fmt::format("{}: train.label_smoothing smooths the default cross-entropy loss, but model "
                                    "\"{}\" brings its own loss",
                                    source, config.model.name));
    }
    // The training loss (and the finders'); evaluate() keeps the plain cross-entropy (set_eval_loss below).
    parts.loss = train::cross_entropy_loss(config.train.label_smoothing);
  }
  run.loss = parts.loss;
  train::ForwardFn forward = std::move(parts.forward);
#if TRAINKIT_WITH_DISTRIBUTED
  const bool fully_sharded = options.distributed() && config.distributed.zero.stage() == 3;
  if (fully_sharded) check_fully_shardable(config, parts, source);
  // Built before any resume: the broadcast from rank 0 happens here, so every rank that then loads the same
  // checkpoint agrees on parameters and optimizer states. (Stage 3's FullyShardedDataParallel has its own.)
  if (run.group && !fully_sharded) {
    run.ddp = std::make_unique<dist::DistributedDataParallel>(run.model, run.group, config.distributed.ddp);
    spdlog::info("distributed: {} ranks, backend {}, {} gradient buckets", run.world_size,
                 run.group->backend_name(run.device), run.ddp->bucket_indices().size());
    // Buffers (BatchNorm statistics) from rank 0 before a forward, as PyTorch's DDP.forward does.
    forward = [inner = std::move(forward), ddp = run.ddp.get()](const data::Batch& batch) {
      ddp->pre_forward();
      return inner(batch);
    };
  }
#endif
  run.optimizer = make_run_optimizer(run, config, source);
  // The optimizer built above lays out the param groups (one, the no-decay split, layer decay or LRs by name,
  // each with its options); ZeRO and the offload rebuild the config's optimizer over them with this factory. By
  // value: the factory lives in the optimizer, which may outlive `config` (ZeRO makes optimizers again when a
  // checkpoint is resharded).
  const optim::HostOptimizerFactory factory =
      [spec = config.optimizer](std::vector<torch::optim::OptimizerParamGroup> groups) {
        return optim::make_optimizer(spec, groups);
      };
#if TRAINKIT_WITH_DISTRIBUTED
  if (options.distributed() && config.distributed.zero.stage() > 0) {
    // ZeRO shards the groups and each rank's factory makes the same optimizer over its part of every group
    // (offloaded: the shard's optimizer on the host).
    std::vector<torch::optim::OptimizerParamGroup> groups(run.optimizer->param_groups().begin(),
                                                          run.optimizer->param_groups().end());
    const optim::HostOptimizerFactory shard_factory =
        config.distributed.offload_optimizer ? optim::offloaded(factory) : factory;
    std::unique_ptr<dist::ZeroRedundancyOptimizer> zero;
    try {
      if (fully_sharded) {
        // One process: a 1-rank group, so that its checkpoints are stage 3 shards that more ranks resume.
        run.fsdp = std::make_shared<dist::FullyShardedDataParallel>(
            run.model, dist::sequential_units(parts.sequential),
            run.group ? run.group : dist::ProcessGroup::init(dist::InitOptions()), std::move(groups), shard_factory,
            dist::FullyShardOptions().ddp(config.distributed.ddp));
        spdlog::info("distributed: {} rank{}, backend {}, {} units fully sharded, {} gradient buckets", run.world_size,
                     run.world_size == 1 ? "" : "s", run.fsdp->process_group()->backend_name(run.device),
                     run.fsdp->unit_names().size(), run.fsdp->ddp().bucket_indices().size());
      } else if (run.group) {
        zero = std::make_unique<dist::ZeroRedundancyOptimizer>(*run.ddp, std::move(groups), shard_factory,
                                                               config.distributed.zero);
      } else {
        // One process: the whole state is the one rank's shard, so that more ranks can resume it.
        zero = std::make_unique<dist::ZeroRedundancyOptimizer>(
            std::move(groups), dist::ProcessGroup::init(dist::InitOptions()), shard_factory,
            dist::ZeroOptions(config.distributed.zero).stage(1));
      }
    } catch (const std::invalid_argument& e) {
      throw ConfigError(fmt::format("{}: [zero] stage = {}: {}", source, config.distributed.zero.stage(), e.what()));
    }
    const dist::ZeroRedundancyOptimizer& sharded_optimizer = run.fsdp ? run.fsdp->optimizer() : *zero;
    size_t tensors = 0;
    for (const auto& g : sharded_optimizer.param_groups()) tensors += g.params().size();
    spdlog::info("zero: stage {}, {} param group{}, rank 0 owns {} of {} parameter tensors{}",
                 config.distributed.zero.stage(), sharded_optimizer.param_groups().size(),
                 sharded_optimizer.param_groups().size() == 1 ? "" : "s", sharded_optimizer.shard(0).size(), tensors,
                 run.group ? "" : " (one process: its state is saved as a 1-rank shard)");
    if (run.fsdp) {
      run.zero = &run.fsdp->optimizer();
      run.optimizer = std::shared_ptr<torch::optim::Optimizer>(run.fsdp, run.zero);  // owned by the FSDP
      // Each unit is gathered for its forward and again for its backward, which recomputes it.
      run.forward = [fsdp = run.fsdp.get(), model = parts.sequential](const data::Batch& batch) {
        return dist::forward_sequential(*fsdp, model, batch.input());
      };
      forward = [fsdp = run.fsdp.get(), sharded = run.forward](const data::Batch& batch) {
        fsdp->ddp().pre_forward();  // buffers from rank 0, as DDP's forward
        return sharded(batch);
      };
    } else {
      run.zero = zero.get();
      run.optimizer = std::move(zero);
    }
  }
#endif
  torch::optim::Optimizer* stepping = run.optimizer.get();  // the optimizer that steps this rank's parameters
#if TRAINKIT_WITH_DISTRIBUTED
  if (run.zero != nullptr) stepping = run.zero->local_optimizer();
#endif
  const bool sharded = stepping != run.optimizer.get();
  if (config.distributed.offload_optimizer && !sharded) {
    // No ZeRO: the whole optimizer steps on the host, over the param groups laid out above.
    std::vector<torch::optim::OptimizerParamGroup> groups(run.optimizer->param_groups().begin(),
                                                          run.optimizer->param_groups().end());
    run.optimizer = std::make_unique<optim::OffloadOptimizer>(std::move(groups), factory);
    stepping = run.optimizer.get();
  }
  if (const auto* offload = dynamic_cast<const optim::OffloadOptimizer*>(stepping)) {
    spdlog::info("offload_optimizer: the {}optimizer's state and step on the host ({:.2f} MiB of masters and gradient "
                 "buffers), parameters on {}{}",
                 sharded ? "ZeRO shard's " : "", static_cast<double>(offload->host_buffer_bytes()) / 1048576.0,
                 run.device.str(), run.device.is_cpu() ? " (on the CPU offload only adds copies)" : "");
  }
  const int64_t accumulation = config.trainer.accumulation_steps();
  run.steps_per_epoch = (run.train->num_batches() + accumulation - 1) / accumulation;
  run.trainer = std::make_unique<train::Trainer>(run.model, std::move(forward), *run.optimizer, config.trainer);
  if (parts.loss) {
    run.trainer->set_loss(parts.loss);
  }
  if (config.train.label_smoothing > 0.0) {
    run.trainer->set_eval_loss(train::cross_entropy_loss());
  }
  attach_precision(run, config, source);
#if TRAINKIT_WITH_DISTRIBUTED
  if (run.zero != nullptr) {
    // Each rank holds a shard of the gradients (stage 2): the clipped norm and the inf check span all ranks.
    run.trainer->set_clip_grad_norm([zero = run.zero](double max_norm, double norm_type) {
      return zero->clip_grad_norm_(max_norm, norm_type);
    });
    if (run.trainer->grad_scaler()) {
      run.trainer->grad_scaler()->set_found_inf_reducer(run.zero->found_inf_reducer());
    }
  }
  if (run.fsdp) {
    // A checkpoint's model is each rank's shard of the parameters (and every buffer).
    run.trainer->set_model_state(
        [fsdp = run.fsdp.get()](torch::serialize::OutputArchive& archive) { fsdp->save_model(archive); },
        [fsdp = run.fsdp.get()](torch::serialize::InputArchive& archive) { fsdp->load_model(archive); });
  }
#endif
  attach_metrics(run, config, source);
  if (config.scheduler) {
    try {
      run.scheduler = sched::make_scheduler(*config.scheduler, *run.optimizer,
                                            sched::SchedulerContext{config.trainer.epochs(), run.steps_per_epoch});
    } catch (const ArgError& e) {
      throw ConfigError(e.what());
    }
    spdlog::info("scheduler {} stepped per {}", run.scheduler->scheduler->name(), run.scheduler->interval);
    run.trainer->set_scheduler(run.scheduler->scheduler, run.scheduler->interval == "step", config.train.monitor);
  }
#if TRAINKIT_WITH_DISTRIBUTED
  if (run.group) {
    // Gradient accumulation: only the last micro-batch of a window all-reduces the gradients.
    run.trainer->set_no_sync([ddp = run.fsdp ? &run.fsdp->ddp() : run.ddp.get()] {
      return std::make_shared<dist::DistributedDataParallel::NoSyncGuard>(*ddp);
    });
    // Evaluation sums (loss, sample count, metric statistics) over every rank's part of val and test.
    run.trainer->set_metric_reducer([group = run.group, device = run.device](at::Tensor& sums) {
      at::Tensor on_device = sums.to(device);  // NCCL reduces device tensors only
      group->all_reduce(on_device).wait();
      sums.copy_(on_device);
    });
  }
#endif
  attach_hooks(run, config, options, source);
  attach_outputs(run, config, options);
  return run;
}

}  // namespace trainkit::app
