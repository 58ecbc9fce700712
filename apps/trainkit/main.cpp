// trainkit: the command-line front end. Subcommands: train, tune, lr-find, batch-size, checkpoint, launch.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>

#include "trainkit/app/cli.h"
#include "trainkit/compat.h"
#include "trainkit/data/idx.h"
#include "trainkit/features.h"
#if TRAINKIT_WITH_DISTRIBUTED
#include "trainkit/dist/launch.h"
#endif
#include "trainkit/app/config.h"
#include "trainkit/app/jobs.h"
#include "trainkit/app/main.h"
#include "trainkit/app/tune_job.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/version.h"

namespace {

using trainkit::app::kExitUsage;

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"trainkit " TRAINKIT_VERSION ": training techniques for LibTorch " +
                         trainkit::compat::torch_version()};
  cli.require_subcommand();
  std::string log_level = "info";
  cli.option("--log-level", log_level, "trace, debug, info, warn, error or off")
      .one_of({"trace", "debug", "info", "warn", "error", "off"});

  trainkit::app::TrainJobOptions train_options;
  bool list_keys = false;
  auto& train = cli.subcommand("train", "Train a model on Fashion-MNIST from a TOML config");
  train.option("--config", train_options.config_path, "TOML config file (e.g. configs/fashion_mnist.toml)");
  train.option("--set", train_options.overrides, "Override one key: section.key=value (repeatable)");
  train.option("--out", train_options.out_dir, "Run directory (default runs/<config>-<time>)");
  train.option("--resume", train_options.resume,
               "auto (newest good checkpoint in --out) or a checkpoint file");
  train.flag("--list-keys", list_keys, "Print every config key as a Markdown table and exit");
  train.option("--log-level", log_level, "trace, debug, info, warn, error or off")
      .one_of({"trace", "debug", "info", "warn", "error", "off"});

  trainkit::app::TuneJobOptions tune_options;
  auto& tune = cli.subcommand(
      "tune", "Hyperparameter search: each trial is a `trainkit train` run of --config with the tuned keys of "
              "--space set (Bayesian optimization with a Gaussian process, TPE, or random search)");
  tune.option("--config", tune_options.config_path, "Base TOML config of every trial").required();
  tune.option("--space", tune_options.space_path, "Search-space TOML file (see docs/tuning.md)").required();
  tune.option("--out", tune_options.out_dir, "Study directory (a re-run continues the study in it)").required();
  tune.option("--trials", tune_options.trials, "Trials wanted in the study in total (all workers')").show_default();
  tune.option("--study-name", tune_options.study_name,
              "The study's name in OUT/study.journal (default: the name of the --out directory)");
  tune.option("--jobs", tune_options.jobs, "Trials run at once").show_default();
  tune.option("--set", tune_options.overrides, "Override one key of every trial: section.key=value (repeatable)");
  tune.option("--metric", tune_options.metric, "Objective: val_loss, val_<metric>, test_loss or test_<metric>")
      .show_default();
  tune.option("--direction", tune_options.direction,
              "minimize or maximize (default: maximize for accuracy metrics, else minimize)");
  tune.option("--sampler", tune_options.sampler,
              "gp, tpe or random (default: the space file's `sampler`, else gp)");
  tune.option("--startup-trials", tune_options.startup_trials,
              "gp, tpe: trials of the initial design (Sobol; tpe: random) before the model takes over (tpe: "
              "unless the space file sets tpe.n_startup_trials)")
      .show_default();
  tune.option("--seed", tune_options.seed, "Study seed").show_default();
  tune.flag("--prune", tune_options.prune,
            "Median-stop trials from their per-epoch validation metric (the space file's `pruner` chooses "
            "successive_halving or hyperband)");
  tune.option("--log-level", log_level, "trace, debug, info, warn, error or off")
      .one_of({"trace", "debug", "info", "warn", "error", "off"});

  std::string lr_config;
  std::vector<std::string> lr_overrides;
  trainkit::app::LrFindJobOptions lr_options;
  double start_lr = lr_options.finder.start_lr();
  double end_lr = lr_options.finder.end_lr();
  int64_t num_iter = lr_options.finder.num_iter();
  std::string step_mode = lr_options.finder.step_mode();
  auto& lr_find = cli.subcommand("lr-find", "LR range test on a train config's model, optimizer and data");
  lr_find.option("--config", lr_config, "TOML config file (e.g. configs/fashion_mnist.toml)");
  lr_find.option("--set", lr_overrides, "Override one key: section.key=value (repeatable)");
  lr_find.option("--out", lr_options.out_dir, "Directory for lr_find.csv and lr_find.svg").show_default();
  lr_find.option("--start-lr", start_lr, "First LR").show_default();
  lr_find.option("--end-lr", end_lr, "Last LR").show_default();
  lr_find.option("--num-iter", num_iter, "Steps").show_default();
  lr_find.option("--step-mode", step_mode, "exp or linear").show_default();
  lr_find.flag("--val", lr_options.use_val, "Record the validation loss instead of the training loss");
  lr_find.option("--log-level", log_level, "trace, debug, info, warn, error or off")
      .one_of({"trace", "debug", "info", "warn", "error", "off"});

  std::string bs_config;
  std::vector<std::string> bs_overrides;
  trainkit::app::BatchSizeJobOptions bs_options;
  std::string bs_mode = bs_options.finder.mode();
  int64_t bs_steps = bs_options.finder.steps_per_trial();
  int64_t bs_init = bs_options.finder.init_val();
  int64_t bs_max_trials = bs_options.finder.max_trials();
  int64_t bs_max_val = 0;
  double bs_budget_mib = 1024;
  auto& batch_size = cli.subcommand("batch-size", "Batch-size finder on a train config's model, optimizer and data");
  batch_size.option("--config", bs_config, "TOML config file (e.g. configs/fashion_mnist.toml)");
  batch_size.option("--set", bs_overrides, "Override one key: section.key=value (repeatable)");
  batch_size.option("--mode", bs_mode, "power, binsearch or throughput").show_default()
      .one_of({"power", "binsearch", "throughput"});
  batch_size.option("--steps-per-trial", bs_steps, "Optimizer steps per tried size").show_default();
  batch_size.option("--init-val", bs_init, "First size tried").show_default();
  batch_size.option("--max-trials", bs_max_trials, "Most trials").show_default();
  batch_size.option("--max-val", bs_max_val, "Largest size (0 = the training samples)").show_default();
  batch_size.option("--memory-budget-mib", bs_budget_mib,
                    "CPU: a trial fails when its peak adds more resident memory than this (MiB)")
      .show_default();
  batch_size.option("--log-level", log_level, "trace, debug, info, warn, error or off")
      .one_of({"trace", "debug", "info", "warn", "error", "off"});
  std::vector<std::string> checkpoint_files;
  auto& checkpoint = cli.subcommand(
      "checkpoint", "Verify checkpoint files (header, size, CRC, archive; a commit record: each shard against it) and "
                    "print each one's position and a digest of its model, trainer position and RNG state (equal "
                    "digests: bitwise-equal runs)");
  checkpoint.option("files", checkpoint_files,
                    "Checkpoint files (.tkpt), or the commit records (.commit) of sharded checkpoints")
      .required();
#if TRAINKIT_WITH_DISTRIBUTED
  trainkit::dist::LaunchOptions launch_options;
  int64_t nproc = launch_options.nproc();
  int64_t master_port = launch_options.master_port();
  std::string master_addr = launch_options.master_addr();
  int64_t max_restarts = launch_options.max_restarts();
  std::vector<std::string> command;
  auto& launch = cli.subcommand(
      "launch", "Run N copies of COMMAND with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...): "
                "trainkit launch --nproc N [--nnodes M --node-rank K] [--master-addr A] [--master-port P] "
                "[--max-restarts R] -- COMMAND...");
  int64_t nnodes = launch_options.nnodes();
  int64_t node_rank = launch_options.node_rank();
  launch.option("--nproc", nproc, "Processes (ranks) to start on this machine").show_default();
  launch.option("--nnodes", nnodes, "Machines in the job, one launcher each (same --master-addr/--master-port)")
      .show_default();
  launch.option("--node-rank", node_rank, "This machine's index, 0 .. nnodes-1 (node 0 hosts rank 0)").show_default();
  launch.option("--master-port", master_port, "Port of rank 0's TCPStore (0: any free port)").show_default();
  launch.option("--master-addr", master_addr, "Address the ranks use to reach rank 0").show_default();
  launch.option("--max-restarts", max_restarts,
                "When a rank fails, stop the others and start all again, at most this many times (the command "
                "resumes itself, e.g. trainkit train --resume auto)")
      .show_default()
      .non_negative();
  launch.option("command", command, "The program and its arguments (after --)");
#endif

  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level(log_level);

  if (train.parsed()) {
    if (list_keys) {
      std::cout << trainkit::app::config_keys_markdown();
      return 0;
    }
    if (train_options.config_path.empty()) {
      std::cerr << "train: --config is required\nRun with --help for more information.\n";
      return kExitUsage;
    }
    return trainkit::app::run_main([&] {
      const int stop_signal = trainkit::app::run_train_job(train_options).stop_signal;
      return stop_signal != 0 ? 128 + stop_signal : 0;  // 143 after SIGTERM, as a process it had ended
    });
  }
  if (checkpoint.parsed()) {
    int code = 0;
    for (const auto& file : checkpoint_files) {
      try {
        std::vector<std::string> files{file};
        if (std::filesystem::path(file).extension() == ".commit") {
          // A sharded checkpoint: the record, then each rank's shard.
          const auto entry = trainkit::train::verify_commit(file);
          std::cout << fmt::format("{}: ok, step {} committed by {} ranks\n", file, entry.step, entry.world_size());
          files = entry.files;
        }
        for (const auto& one : files) {
          const auto d = trainkit::train::digest_checkpoint(one);
          std::cout << fmt::format("{}: ok, epoch {} batch {} step {}, {} model tensors, digest {:016x}\n", one,
                                   d.epoch, d.batch, d.step, d.tensors, d.digest);
        }
      } catch (const std::exception& e) {
        std::cerr << "checkpoint: " << e.what() << "\n";
        code = 1;
      }
    }
    return code;
  }
#if TRAINKIT_WITH_DISTRIBUTED
  if (launch.parsed()) {
    try {
      return trainkit::dist::launch(
          launch_options.nproc(nproc).nnodes(nnodes).node_rank(node_rank).master_port(master_port).master_addr(master_addr)
              .max_restarts(max_restarts).command(command));
    } catch (const std::invalid_argument& e) {
      std::cerr << e.what() << "\nRun with --help for more information.\n";
      return kExitUsage;
    } catch (const std::exception& e) {
      std::cerr << "launch: " << e.what() << "\n";
      return 1;
    }
  }
#endif
  if (tune.parsed()) {
    return trainkit::app::run_main([&] {
      trainkit::app::run_tune_job(tune_options);
      return 0;
    });
  }
  if (lr_find.parsed()) {
    if (lr_config.empty()) {
      std::cerr << "lr-find: --config is required\nRun with --help for more information.\n";
      return kExitUsage;
    }
    lr_options.finder.start_lr(start_lr).end_lr(end_lr).num_iter(num_iter).step_mode(step_mode);
    return trainkit::app::run_main([&] {
      trainkit::app::run_lr_find_job(trainkit::app::load_config(lr_config, lr_overrides), lr_config, lr_options);
      return 0;
    });
  }
  if (batch_size.parsed()) {
    if (bs_config.empty()) {
      std::cerr << "batch-size: --config is required\nRun with --help for more information.\n";
      return kExitUsage;
    }
    return trainkit::app::run_main([&] {
      bs_options.finder.mode(bs_mode)
          .steps_per_trial(bs_steps)
          .init_val(bs_init)
          .max_trials(bs_max_trials)
          .max_val(bs_max_val)
          .memory_budget(static_cast<int64_t>(bs_budget_mib * 1024 * 1024));
      trainkit::app::run_batch_size_job(trainkit::app::load_config(bs_config, bs_overrides), bs_config, bs_options);
      return 0;
    });
  }
  return 0;
}
