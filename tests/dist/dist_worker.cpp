// dist_worker: one rank of the multi-process tests in tests/dist/test_ddp.cpp, started by `trainkit launch`
// or torchrun (or by the tests with RANK/WORLD_SIZE/MASTER_* set by hand). Modes:
//   ddp    train ChainNet with DistributedDataParallel + SGD(momentum); write rank<r>.pt (parameters)
//   zero   the same with ZeroRedundancyOptimizer(Adam); also prints per-rank optimizer-state bytes
//   fault  train with a checkpoint per step on rank 0; rank 1 kills itself (SIGKILL) at step 5
//   hang   as fault, but rank 1 stops itself (SIGSTOP) at step 5: the others must time out
//   env    helpers: barrier, mean of the ranks, broadcast of rank 0's value
//   unused like ddp, with an extra Linear that gets no gradient (--find-unused decides what happens)
//   scaler like ddp with a GradScaler; rank 1's loss is inf at step 2: every rank must skip that step
//   metrics evaluate a fixed model on this rank's half of a fixed data set with the Trainer, reducing loss
//           and metrics through an all-reduce; prints them
//   zero2  ZeroRedundancyOptimizer over the DDP (--stage 1|2, --optim adam|adamw|sgd|lamb) with accumulation,
//          --clip (the norm over all ranks), --scaler (an inf in one gradient of rank 0's shard at step 2),
//          --save-dir/--load-dir (sharded checkpoints; any world size), --ckpt-dir/--resume (checkpoints
//          committed across ranks after every step; --kill-step: a rank killed during a save; --sync-every:
//          every micro-batch reduces instead of all but the last running under no_sync;
//          --ckpt-per-rank: directories the ranks do not share), --optim layer_decay (26 param groups),
//          --offload (each shard's optimizer an optim::OffloadOptimizer); prints bytes per rank
//   fsdp   ChainNet under FullyShardedDataParallel (ZeRO-3), each of its 13 layers a unit; the zero2 options
//          (--optim, --accum, --clip, --scaler, --save-dir/--load-dir with any world size); rank 0 writes the
//          full parameters; prints the parameter, gradient and optimizer-state bytes per rank
//   nccl_style  under TRAINKIT_DIST_BACKEND=testdev:refuse_cpu (a device backend that refuses CPU tensors, as
//          NCCL does; tests/dist/refusing_backend.h): the CPU-side helpers, an all-reduce of a CPU and of a
//          testdev tensor, and ZeRO-2's clip and found-inf reduction over a DDP on testdev:0; prints what each
//          gave and how many calls the device backend served
//   pipeline  one process: a 2-stage Pipeline on testdev:0 and testdev:1; prints the current device each
//          stage's thread ran with and the difference from the unsplit model
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include "device/testdev.h"
#include "dist/dist_common.h"
#include "dist/refusing_backend.h"
#include "trainkit/amp/grad_scaler.h"
#include "trainkit/app/cli.h"
#include "trainkit/dist/checkpoint_group.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/fully_shard.h"
#include "trainkit/dist/pipeline.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/dist/zero.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/optim/offload.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/trainer.h"

namespace td = trainkit::test::dist;

namespace {

struct ZeroArgs {
  int64_t stage = 2;
  std::string optim = "adam";
  double clip = 0.0;
  bool scaler = false;
  int64_t micro = td::kMicro;
  std::string save_dir;
  std::string load_dir;
  int64_t steps = 4;
  int64_t data_steps = 0;  // 0: steps
  int64_t accum = 1;
  bool sync_every = false;  // every micro-batch's backward reduces (no no_sync): the owners accumulate the means
  double bucket_kb = 1.0;
  std::string out = ".";
  std::string ckpt_dir;      // checkpoints through a CheckpointManager (sharded, committed) after every step
  bool ckpt_per_rank = false;  // rank r uses <ckpt_dir>/node<r>: a directory the ranks do not share
  bool resume = false;         // continue from the newest checkpoint of ckpt_dir
  int64_t keep = 3;
  int64_t kill_step = -1;  // the rank kill_rank SIGKILLs itself while saving this step (before the rename)
  int64_t kill_rank = 1;
  bool offload = false;  // each shard's optimizer is an optim::OffloadOptimizer
};

/// Mode zero2: ChainNet with DDP + ZeroRedundancyOptimizer. A run that loads continues at the step saved.
int run_zero(const std::shared_ptr<trainkit::dist::ProcessGroup>& pg, const ZeroArgs& a) {
  const int64_t rank = pg->rank();
  const int64_t world = pg->world_size();
  auto net = td::make_chain_net(7 + static_cast<uint64_t>(rank));
  trainkit::dist::DistributedDataParallel ddp(
      net, pg,
      trainkit::dist::DistributedDataParallelOptions().bucket_cap_mb(a.bucket_kb / 1024.0).first_bucket_mb(a.bucket_kb / 1024.0));
  // "layer_decay": 26 param groups (td::make_layer_decay_groups) through the grouped constructor.
  std::unique_ptr<trainkit::dist::ZeroRedundancyOptimizer> zero_ptr;
  if (a.offload) {
    // --offload: the same optimizers, each shard's stepping host masters (optim::OffloadOptimizer).
    const bool grouped = a.optim == "layer_decay";
    zero_ptr = std::make_unique<trainkit::dist::ZeroRedundancyOptimizer>(
        ddp,
        grouped ? td::make_layer_decay_groups(*net)
                : std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(net->parameters())},
        trainkit::optim::offloaded([&a, grouped](std::vector<torch::optim::OptimizerParamGroup> host) {
          return grouped ? td::make_layer_decay_optimizer(std::move(host))
                         : td::make_zero_test_optimizer(a.optim, host.front().params());
        }),
        trainkit::dist::ZeroOptions().stage(a.stage));
  } else if (a.optim == "layer_decay") {
    zero_ptr = std::make_unique<trainkit::dist::ZeroRedundancyOptimizer>(
        ddp, td::make_layer_decay_groups(*net), td::make_layer_decay_optimizer,
        trainkit::dist::ZeroOptions().stage(a.stage));
  } else {
    zero_ptr = std::make_unique<trainkit::dist::ZeroRedundancyOptimizer>(
        ddp,
        [&a](std::vector<at::Tensor> params) { return td::make_zero_test_optimizer(a.optim, std::move(params)); },
        trainkit::dist::ZeroOptions().stage(a.stage));
  }
  trainkit::dist::ZeroRedundancyOptimizer& zero = *zero_ptr;
  trainkit::amp::GradScaler scaler(c10::kCPU, trainkit::amp::GradScalerOptions().init_scale(1024.0).enabled(a.scaler));
  scaler.set_found_inf_reducer(zero.found_inf_reducer());
  int64_t start = 0;
  // Committed checkpoints: the parameters, the step and this rank's ZeRO shard, one per step.
  std::shared_ptr<trainkit::train::CheckpointManager> manager;
  if (!a.ckpt_dir.empty()) {
    manager = std::make_shared<trainkit::train::CheckpointManager>(
        a.ckpt_per_rank ? a.ckpt_dir + "/node" + std::to_string(rank) : a.ckpt_dir, a.keep);
    manager->set_sharded(trainkit::dist::checkpoint_group(pg));
  }
  if (manager && a.resume) {
    const auto entry = manager->latest();
    trainkit::train::check_same_checkpoint(entry ? entry->step : -1, manager->dir(),
                                           trainkit::dist::checkpoint_group(pg));
    if (entry) {
      torch::serialize::InputArchive archive;
      trainkit::train::load_checkpoint(entry->file_for(rank, world), archive);
      const auto params = net->parameters();
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        at::Tensor saved;
        archive.read("param" + std::to_string(i), saved);
        params[i].copy_(saved);
      }
      at::Tensor step;
      archive.read("step", step);
      start = step.item<int64_t>();
      zero.set_shard_reader(trainkit::dist::nested_shard_reader(
          [entry](int64_t r, int64_t w) -> std::unique_ptr<torch::serialize::InputArchive> {
            if (w != entry->world_size()) return nullptr;
            auto whole = std::make_unique<torch::serialize::InputArchive>();
            trainkit::train::load_checkpoint(entry->files.at(static_cast<size_t>(r)), *whole);
            return whole;
          },
          "optimizer"));
      torch::serialize::InputArchive optimizer;
      archive.read("optimizer", optimizer);
      zero.load(optimizer);
      zero.set_shard_reader(nullptr);
      std::printf("rank %lld: resumed step %lld from %s (%lld ranks)\n", static_cast<long long>(rank),
                  static_cast<long long>(start), entry->name().c_str(), static_cast<long long>(entry->world_size()));
    }
  }
  const auto save = [&](int64_t step) {
    if (!manager) return;
    torch::serialize::OutputArchive archive;
    const auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) archive.write("param" + std::to_string(i), params[i]);
    archive.write("step", at::tensor(step));
    torch::serialize::OutputArchive optimizer;
    zero.save(optimizer);
    archive.write("optimizer", optimizer);
    if (step == a.kill_step && rank == a.kill_rank) {
      manager->set_before_rename([rank] {
        std::printf("rank %lld: killing myself during a save\n", static_cast<long long>(rank));
        std::fflush(stdout);
        ::raise(SIGKILL);
      });
    }
    manager->save(step, archive);
  };
  if (!a.load_dir.empty()) {
    std::vector<at::Tensor> saved;
    torch::load(saved, a.load_dir + "/model.pt");
    const auto params = net->parameters();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(saved.at(i));
    start = saved.back().item<int64_t>();
    zero.load_sharded(a.load_dir);
  }
  // The data of `data_steps` steps (labels depend on the length): a saved run and its continuation agree.
  const auto data = td::make_data((a.data_steps > 0 ? a.data_steps : a.steps) * world * a.accum * a.micro);
  std::string skipped;
  trainkit::dist::CommStats no_sync_comm, sync_comm;
  int64_t grad_bytes = 0;
  for (int64_t step = start; step < a.steps; ++step) {
    zero.zero_grad();
    for (int64_t k = 0; k < a.accum; ++k) {
      auto x = td::rows(data.first, step, k, rank, world, a.accum, a.micro);
      auto y = td::rows(data.second, step, k, rank, world, a.accum, a.micro);
      const auto before = pg->stats();
      {
        std::optional<trainkit::dist::DistributedDataParallel::NoSyncGuard> guard;
        if (k + 1 < a.accum && !a.sync_every) guard.emplace(ddp);
        scaler.scale(torch::nn::functional::cross_entropy(net->forward(x), y) / static_cast<double>(a.accum)).backward();
      }
      const auto after = pg->stats();
      auto& count = k + 1 < a.accum ? no_sync_comm : sync_comm;
      count.reduces += after.reduces - before.reduces;
      count.reduce_bytes += after.reduce_bytes - before.reduce_bytes;
      count.all_reduces += after.all_reduces - before.all_reduces;
    }
    grad_bytes = zero.local_gradient_bytes();
    if (a.scaler && step == 2 && zero.owner(0) == rank) {
      // An overflow in one gradient of rank 0's shard only: every rank must skip the step.
      torch::NoGradGuard no_grad;
      net->parameters()[0].grad().view({-1})[0] = std::numeric_limits<double>::infinity();
    }
    if (a.clip > 0) {
      scaler.unscale_(zero);
      const double norm = zero.clip_grad_norm_(a.clip).item<double>();
      std::printf("rank %lld: step %lld norm %.12f\n", static_cast<long long>(rank), static_cast<long long>(step), norm);
    }
    if (!scaler.step(zero)) skipped += " " + std::to_string(step);
    scaler.update();
    save(step + 1);
  }
  std::printf("rank %lld: stage %lld: gradient bytes %lld, optimizer state bytes %lld, bucket bytes %lld, %zu of %zu "
              "parameters\n",
              static_cast<long long>(rank), static_cast<long long>(zero.stage()), static_cast<long long>(grad_bytes),
              static_cast<long long>(zero.local_state_bytes()), static_cast<long long>(ddp.bucket_bytes()),
              zero.shard(rank).size(), net->parameters().size());
  std::printf("rank %lld: backward reduces: %lld (%lld bytes) under no_sync, %lld (%lld bytes) synchronising, "
              "%lld all-reduces\n",
              static_cast<long long>(rank), static_cast<long long>(no_sync_comm.reduces),
              static_cast<long long>(no_sync_comm.reduce_bytes), static_cast<long long>(sync_comm.reduces),
              static_cast<long long>(sync_comm.reduce_bytes),
              static_cast<long long>(no_sync_comm.all_reduces + sync_comm.all_reduces));
  if (a.scaler) {
    std::printf("rank %lld: skipped steps:%s; scale %g\n", static_cast<long long>(rank), skipped.c_str(),
                scaler.get_scale());
  }
  if (!a.save_dir.empty()) {
    zero.save_sharded(a.save_dir);
    if (rank == 0) {
      auto saved = td::snapshot(*net);
      saved.push_back(at::tensor(a.steps));
      torch::save(saved, a.save_dir + "/model.pt");
    }
  }
  torch::save(td::snapshot(*net), a.out + "/rank" + std::to_string(rank) + ".pt");
  return 0;
}

/// Mode fsdp: ChainNet under FullyShardedDataParallel, one unit per layer (what mode zero2 does otherwise).
int run_fsdp(const std::shared_ptr<trainkit::dist::ProcessGroup>& pg, const ZeroArgs& a) {
  namespace dist = trainkit::dist;
  const int64_t rank = pg->rank();
  const int64_t world = pg->world_size();
  auto net = td::make_chain_net(7 + static_cast<uint64_t>(rank));
  std::vector<std::string> units;
  for (size_t i = 0; i < net->layers.size(); ++i) units.push_back("layer" + std::to_string(i));
  units.push_back("head");
  const auto options = dist::FullyShardOptions().ddp(
      dist::DistributedDataParallelOptions().bucket_cap_mb(a.bucket_kb / 1024.0).first_bucket_mb(a.bucket_kb / 1024.0));
  auto fsdp = a.optim == "layer_decay"
                  ? std::make_unique<dist::FullyShardedDataParallel>(net, units, pg, td::make_layer_decay_groups(*net),
                                                                     td::make_layer_decay_optimizer, options)
                  : std::make_unique<dist::FullyShardedDataParallel>(
                        net, units, pg,
                        [&a](std::vector<at::Tensor> params) {
                          return td::make_zero_test_optimizer(a.optim, std::move(params));
                        },
                        options);
  auto& opt = fsdp->optimizer();
  trainkit::amp::GradScaler scaler(c10::kCPU, trainkit::amp::GradScalerOptions().init_scale(1024.0).enabled(a.scaler));
  scaler.set_found_inf_reducer(opt.found_inf_reducer());
  // The most trainable-parameter bytes held while a unit ran (its parameters gathered).
  int64_t peak = 0;
  const auto unit = [&](size_t i, const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x) {
    return fsdp->run(i, [&, fn](const at::Tensor& in) {
      peak = std::max(peak, fsdp->local_parameter_bytes());
      return fn(in);
    }, x);
  };
  const auto forward = [&](at::Tensor x) {
    for (size_t i = 0; i < net->layers.size(); ++i) {
      x = torch::tanh(unit(i, [&net, i](const at::Tensor& in) { return net->layers[i]->forward(in); }, x));
    }
    return unit(net->layers.size(), [&net](const at::Tensor& in) { return net->head->forward(in); }, x);
  };
  const auto shard_path = [](const std::string& dir, int64_t r, int64_t w) {
    return dir + "/fsdp_shard_" + std::to_string(r) + "_of_" + std::to_string(w) + ".pt";
  };
  int64_t start = 0;
  if (!a.load_dir.empty()) {
    int64_t saved_world = 1;
    while (!std::filesystem::exists(shard_path(a.load_dir, 0, saved_world)) && saved_world < 64) ++saved_world;
    const auto read = [&](int64_t r, int64_t w) -> std::unique_ptr<torch::serialize::InputArchive> {
      if (!std::filesystem::exists(shard_path(a.load_dir, r, w))) return nullptr;
      auto archive = std::make_unique<torch::serialize::InputArchive>();
      trainkit::train::load_checkpoint(shard_path(a.load_dir, r, w), *archive);
      return archive;
    };
    auto first = read(saved_world == world ? rank : 0, saved_world);
    fsdp->set_shard_reader(read);
    fsdp->load(*first);
    fsdp->set_shard_reader(nullptr);
    at::Tensor step;
    first->read("step", step);
    start = step.item<int64_t>();
  }
  const auto data = td::make_data((a.data_steps > 0 ? a.data_steps : a.steps) * world * a.accum * a.micro);
  std::string skipped;
  int64_t after_forward = -1, after_backward = -1, grad_bytes = 0, gathered = 0;
  for (int64_t step = start; step < a.steps; ++step) {
    opt.zero_grad();
    for (int64_t k = 0; k < a.accum; ++k) {
      auto x = td::rows(data.first, step, k, rank, world, a.accum, a.micro);
      auto y = td::rows(data.second, step, k, rank, world, a.accum, a.micro);
      std::optional<dist::DistributedDataParallel::NoSyncGuard> guard;
      if (k + 1 < a.accum && !a.sync_every) guard.emplace(fsdp->ddp());
      const at::Tensor loss = torch::nn::functional::cross_entropy(forward(x), y) / static_cast<double>(a.accum);
      after_forward = fsdp->local_parameter_bytes();
      gathered += fsdp->gathered_units();
      scaler.scale(loss).backward();
      after_backward = fsdp->local_parameter_bytes();
      gathered += fsdp->gathered_units();
    }
    grad_bytes = opt.local_gradient_bytes();
    if (a.scaler && step == 2 && fsdp->owner(0) == rank) {
      torch::NoGradGuard no_grad;
      net->parameters()[0].grad().view({-1})[0] = std::numeric_limits<double>::infinity();
    }
    if (a.clip > 0) {
      scaler.unscale_(opt);
      opt.clip_grad_norm_(a.clip);
    }
    if (!scaler.step(opt)) skipped += " " + std::to_string(step);
    scaler.update();
  }
  std::printf("rank %lld: stage 3: parameter bytes %lld, after forward %lld, peak %lld, largest unit %lld, gradient "
              "bytes %lld, optimizer state bytes %lld, units left gathered %lld\n",
              static_cast<long long>(rank), static_cast<long long>(after_backward),
              static_cast<long long>(after_forward), static_cast<long long>(peak),
              static_cast<long long>(fsdp->largest_unit_bytes()), static_cast<long long>(grad_bytes),
              static_cast<long long>(opt.local_state_bytes()), static_cast<long long>(gathered));
  if (a.scaler) {
    std::printf("rank %lld: skipped steps:%s; scale %g\n", static_cast<long long>(rank), skipped.c_str(),
                scaler.get_scale());
  }
  if (!a.save_dir.empty()) {
    std::filesystem::create_directories(a.save_dir);
    torch::serialize::OutputArchive archive;
    fsdp->save(archive);
    archive.write("step", at::tensor(a.steps));
    trainkit::train::save_checkpoint(shard_path(a.save_dir, rank, world), archive);
  }
  // Evaluation (no autograd): each unit gathered and freed around its forward; rank 0 checks the logits
  // against an unsharded copy of the full parameters.
  at::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = forward(data.first.narrow(0, 0, a.micro));
  }
  const int64_t eval_gathered = fsdp->gathered_units();
  const auto full = fsdp->full_state_dict();
  if (rank == 0) {
    std::vector<at::Tensor> params;
    for (const auto& item : net->named_parameters()) params.push_back(full[item.key()]);
    torch::save(params, a.out + "/rank0.pt");
    auto copy = td::make_chain_net(0);
    torch::NoGradGuard no_grad;
    for (const auto& item : copy->named_parameters()) item.value().copy_(full[item.key()]);
    std::printf("rank 0: evaluation: units left gathered %lld, largest difference from the unsharded model %.3g\n",
                static_cast<long long>(eval_gathered),
                (logits - copy->forward(data.first.narrow(0, 0, a.micro))).abs().max().item<double>());
  } else {
    std::printf("rank %lld: full state dict entries %zu\n", static_cast<long long>(rank), full.size());
  }
  return 0;
}

/// Mode nccl_style: the collectives of a group whose device backend refuses CPU tensors.
int run_nccl_style(const std::shared_ptr<trainkit::dist::ProcessGroup>& pg) {
  const int64_t rank = pg->rank();
  const auto rank_text = "rank " + std::to_string(rank);
  const c10::Device dev = trainkit::test::test_device(0);
  std::printf("%s: backends cpu %s, testdev %s\n", rank_text.c_str(), pg->backend_name(c10::kCPU).c_str(),
              pg->backend_name(dev).c_str());
  // The CPU-side helpers (apps/ddp, apps/zero, the docs' example).
  pg->barrier();
  const double mean = pg->all_reduce_mean(static_cast<double>(rank));
  const double sum = pg->all_reduce_sum(1.0 + static_cast<double>(rank));
  const double root = pg->broadcast_value(100.0 + static_cast<double>(rank));
  at::Tensor cpu = at::full({3}, static_cast<double>(rank + 1), at::kDouble);
  pg->all_reduce(cpu).wait();
  std::printf("%s: cpu-side mean %.3f sum %.3f broadcast %.1f cpu all_reduce %.3f; device backend served %lld\n",
              rank_text.c_str(), mean, sum, root, cpu.sum().item<double>(),
              static_cast<long long>(td::refusing_backend_served()));
  // A device tensor goes to the device backend.
  int64_t before = td::refusing_backend_served();
  at::Tensor on_device = at::full({3}, static_cast<double>(rank + 1), at::TensorOptions().dtype(at::kDouble).device(dev));
  pg->all_reduce(on_device).wait();
  std::printf("%s: device all_reduce %.3f on %s; device backend calls %lld\n", rank_text.c_str(),
              on_device.cpu().sum().item<double>(), on_device.device().str().c_str(),
              static_cast<long long>(td::refusing_backend_served() - before));
  // ZeRO-2 over a DDP on the device: the global-norm clip and the found-inf reduction.
  auto net = td::make_chain_net(7 + static_cast<uint64_t>(rank));
  net->to(dev);
  trainkit::dist::DistributedDataParallel ddp(net, pg,
                                              trainkit::dist::DistributedDataParallelOptions().bucket_cap_mb(1.0 / 1024));
  trainkit::dist::ZeroRedundancyOptimizer zero(
      ddp, [](std::vector<at::Tensor> params) { return td::make_zero_test_optimizer("adam", std::move(params)); },
      trainkit::dist::ZeroOptions().stage(2));
  // Stage 2's gradients after backward: this rank's shard only. Parameter i's gradient is 0.01 * (i + 1)
  // everywhere, so the norm over both shards is known.
  const auto params = net->parameters();
  double expected = 0;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      const double g = 0.01 * static_cast<double>(i + 1);
      expected += static_cast<double>(params[i].numel()) * g * g;
      if (zero.owner(static_cast<int64_t>(i)) == rank) params[i].mutable_grad() = torch::full_like(params[i], g);
    }
  }
  expected = std::sqrt(expected);
  before = td::refusing_backend_served();
  const int64_t gloo_before = pg->stats().all_reduces;
  const at::Tensor norm = zero.clip_grad_norm_(0.5);
  std::printf("%s: zero2 clip norm %.12f expected %.12f on %s; device backend calls %lld of %lld all-reduces\n",
              rank_text.c_str(), norm.cpu().item<double>(), expected, norm.device().str().c_str(),
              static_cast<long long>(td::refusing_backend_served() - before),
              static_cast<long long>(pg->stats().all_reduces - gloo_before));
  at::Tensor found_inf = at::full({1}, rank == 0 ? 1.0f : 0.0f, at::TensorOptions().dtype(at::kFloat).device(dev));
  before = td::refusing_backend_served();
  zero.found_inf_reducer()(found_inf);
  std::printf("%s: zero2 found_inf %.1f on %s; device backend calls %lld\n", rank_text.c_str(),
              found_inf.cpu().item<double>(), found_inf.device().str().c_str(),
              static_cast<long long>(td::refusing_backend_served() - before));
  pg->barrier();
  std::printf("%s: device backend refused %lld CPU tensors\n", rank_text.c_str(),
              static_cast<long long>(td::refusing_backend_refused()));
  return 0;
}

/// Mode pipeline: which device each stage's thread has current.
int run_pipeline() {
  const c10::Device dev0 = trainkit::test::test_device(0);
  const c10::Device dev1 = trainkit::test::test_device(1);
  std::mutex mutex;
  std::set<int> seen[2];
  auto recorder = [&](int stage) {
    return torch::nn::Functional([&, stage](at::Tensor x) {
      std::lock_guard<std::mutex> lock(mutex);
      seen[stage].insert(static_cast<int>(c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index()));
      return x;
    });
  };
  torch::manual_seed(3);
  torch::nn::Linear a(5, 4), b(4, 3);
  a->to(torch::kFloat64);
  b->to(torch::kFloat64);
  const at::Tensor x = torch::randn({8, 5}, torch::kFloat64);
  const at::Tensor expected = b->forward(a->forward(x));
  trainkit::dist::Pipeline pipe({torch::nn::Sequential(recorder(0), a), torch::nn::Sequential(recorder(1), b)},
                                {dev0, dev1}, trainkit::dist::PipelineOptions().chunks(4));
  at::Tensor out;
  {
    torch::NoGradGuard no_grad;
    out = pipe.forward(x);
  }
  for (int s = 0; s < 2; ++s) {
    std::string devices;
    for (int d : seen[s]) devices += " testdev:" + std::to_string(d);
    std::printf("stage %d: current device%s\n", s, devices.c_str());
  }
  std::printf("pipeline output on %s, max difference from the unsplit model %.3g\n", out.device().str().c_str(),
              (out.cpu() - expected).abs().max().item<double>());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"One rank of trainkit's multi-process tests (run under `trainkit launch` or torchrun)"};
  std::string mode = "ddp";
  std::string out = ".";
  int64_t steps = 4;
  int64_t accum = 1;
  double bucket_kb = 1.0;
  bool no_overlap = false;
  std::string compression = "none";
  cli.option("--mode", mode, "ddp, zero, fault, hang or env")
      .one_of({"ddp", "zero", "zero2", "fault", "hang", "env", "unused", "scaler", "metrics", "nccl_style", "pipeline", "fsdp"})
      .show_default();
  cli.option("--out", out, "Directory for rank<r>.pt and checkpoints").show_default();
  cli.option("--steps", steps, "Optimizer steps").show_default();
  cli.option("--accum", accum, "Micro-batches per step (all but the last under no_sync)").show_default();
  cli.option("--bucket-kb", bucket_kb, "DDP bucket cap (first bucket too), KiB").show_default();
  cli.flag("--no-overlap", no_overlap, "All-reduce after backward instead of from the hooks");
  cli.option("--compression", compression, "none, fp16 or bf16").show_default();
  bool find_unused = false;
  cli.flag("--find-unused", find_unused, "DDP's find_unused_parameters");
  ZeroArgs za;
  cli.option("--stage", za.stage, "zero2: ZeRO stage").show_default();
  cli.option("--optim", za.optim, "zero2: adam, adamw, sgd, lamb or layer_decay (AdamW, 26 groups)").show_default();
  cli.option("--clip", za.clip, "zero2: clip the gradient norm to this (0 = off)").show_default();
  cli.flag("--sync-every", za.sync_every, "zero2, fsdp: every micro-batch's backward reduces (no no_sync)");
  cli.flag("--scaler", za.scaler, "zero2: GradScaler, with an inf in one gradient of rank 0's shard at step 2");
  cli.option("--data-steps", za.data_steps, "zero2: generate the data of this many steps (0 = --steps)");
  cli.option("--micro", za.micro, "Rows per micro-batch and rank").show_default();
  cli.option("--save-dir", za.save_dir, "zero2: write the model and the shards there after the last step");
  cli.option("--load-dir", za.load_dir, "zero2: start from the model and the shards there");
  cli.option("--ckpt-dir", za.ckpt_dir, "zero2: a committed checkpoint after every step (CheckpointManager)");
  cli.flag("--ckpt-per-rank", za.ckpt_per_rank, "zero2: rank r checkpoints into <ckpt-dir>/node<r> (not shared)");
  cli.flag("--resume", za.resume, "zero2: continue from the newest checkpoint of --ckpt-dir");
  cli.option("--keep", za.keep, "zero2: checkpoints kept").show_default();
  cli.option("--kill-step", za.kill_step, "zero2: --kill-rank SIGKILLs itself while saving this step");
  cli.option("--kill-rank", za.kill_rank, "zero2: the rank that --kill-step kills").show_default();
  cli.flag("--offload", za.offload, "zero2: the shard's optimizer keeps its state and step on the host");
  if (auto rc = cli.parse(argc, argv)) return *rc;

  int64_t rank = -1;
  try {
    if (mode == "pipeline") return run_pipeline();
    if (mode == "nccl_style") {
      trainkit::test::test_device(0);  // registers "testdev" before the backend string names it
      td::register_refusing_backend();
    }
    auto pg = trainkit::dist::ProcessGroup::from_env();
    rank = pg->rank();
    if (mode == "nccl_style") return run_nccl_style(pg);
    const int64_t world = pg->world_size();
    if (mode == "env") {
      pg->barrier();
      const double mean = pg->all_reduce_mean(static_cast<double>(rank));
      const double root = pg->broadcast_value(100.0 + static_cast<double>(rank));
      const auto both = pg->all_reduce_mean(std::vector<double>{1.0 * static_cast<double>(rank), 2.0});
      std::printf("rank %lld of %lld: mean %.3f broadcast %.1f pair %.3f %.3f backend %s\n", static_cast<long long>(rank),
                  static_cast<long long>(world), mean, root, both[0], both[1], pg->backend_name(c10::kCPU).c_str());
      return 0;
    }
    if (mode == "metrics") {
      const td::MetricsProblem problem;
      auto model = problem.model();
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
      trainkit::train::Trainer trainer(model, opt);
      trainer.set_metrics({trainkit::train::accuracy(), trainkit::train::top_k_accuracy(2)});
      trainer.set_metric_reducer([&pg](at::Tensor& t) { pg->all_reduce(t).wait(); });
      trainkit::data::TensorLoader shard(
          problem.x, problem.y,
          trainkit::data::TensorLoaderOptions().batch_size(7).shuffle(false).num_replicas(world).rank(rank));
      const auto r = trainer.evaluate(shard);
      std::printf("rank %lld: samples %lld loss %.12f accuracy %.12f top2 %.12f\n", static_cast<long long>(rank),
                  static_cast<long long>(r.samples), r.loss, r.metric("accuracy"), r.metric("top2_accuracy"));
      return 0;
    }

    if (mode == "zero2" || mode == "fsdp") {
      za.steps = steps;
      za.accum = accum;
      za.bucket_kb = bucket_kb;
      za.out = out;
      return mode == "fsdp" ? run_fsdp(pg, za) : run_zero(pg, za);
    }
    // Each rank starts from a different initialisation: DDP's broadcast makes rank 0's the common one.
    auto net = td::make_chain_net(7 + static_cast<uint64_t>(rank));
    // "unused": the chain plus a Linear that forward never calls (its parameters come last).
    auto holder = std::make_shared<torch::nn::Module>();
    holder->register_module("chain", net);
    if (mode == "unused") holder->register_module("extra", torch::nn::Linear(8, 8));
    trainkit::dist::DistributedDataParallel ddp(holder, pg,
                                                trainkit::dist::DistributedDataParallelOptions()
                                                    .bucket_cap_mb(bucket_kb / 1024.0)
                                                    .first_bucket_mb(bucket_kb / 1024.0)
                                                    .overlap(!no_overlap)
                                                    .compression(compression)
                                                    .find_unused_parameters(find_unused));
    const bool faulty = mode == "fault" || mode == "hang";
    const int64_t total_steps = faulty ? 100000 : steps;
    const auto data = td::make_data((faulty ? 1 : total_steps) * world * accum * td::kMicro);

    std::unique_ptr<torch::optim::Optimizer> plain;
    std::unique_ptr<trainkit::dist::ZeroRedundancyOptimizer> zero;
    if (mode == "zero") {
      zero = std::make_unique<trainkit::dist::ZeroRedundancyOptimizer>(
          net->parameters(), pg, [](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
            return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
          });
    } else {
      plain = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(td::kLr).momentum(0.9));
    }

    trainkit::amp::GradScaler scaler(c10::kCPU, trainkit::amp::GradScalerOptions().init_scale(1024.0).enabled(mode == "scaler"));
    std::string skipped;
    // Collectives started inside the backward passes: under no_sync (all but the last micro-batch of each
    // step) and in the synchronising one.
    trainkit::dist::CommStats comm_no_sync;
    trainkit::dist::CommStats comm_sync;
    for (int64_t step = 0; step < total_steps; ++step) {
      if (plain) plain->zero_grad();
      if (zero) zero->zero_grad();
      const int64_t s = faulty ? 0 : step;
      for (int64_t k = 0; k < accum; ++k) {
        auto x = td::rows(data.first, s, k, rank, world, accum, td::kMicro);
        auto y = td::rows(data.second, s, k, rank, world, accum, td::kMicro);
        auto backward = [&] {
          at::Tensor loss = torch::nn::functional::cross_entropy(net->forward(x), y) / static_cast<double>(accum);
          if (mode == "scaler" && rank == 1 && step == 2) loss = loss * std::numeric_limits<double>::infinity();
          scaler.scale(loss).backward();
        };
        const auto before = pg->stats();
        if (k + 1 < accum) {
          auto guard = ddp.no_sync();
          backward();
        } else {
          backward();
        }
        const auto after = pg->stats();
        auto& count = k + 1 < accum ? comm_no_sync : comm_sync;
        count.all_reduces += after.all_reduces - before.all_reduces;
        count.all_reduce_bytes += after.all_reduce_bytes - before.all_reduce_bytes;
      }
      if (plain) {
        if (!scaler.step(*plain)) skipped += " " + std::to_string(step);
        scaler.update();
      }
      if (zero) zero->step();
      if (faulty) {
        if (rank == 0) {
          torch::serialize::OutputArchive archive;
          net->save(archive);
          archive.write("step", at::tensor(step));
          trainkit::train::save_checkpoint(out + "/last.pt", archive);
        }
        if (rank == 1 && step == 5) {
          std::printf("rank 1: %s myself at step 5\n", mode == "fault" ? "killing" : "stopping");
          std::fflush(stdout);
          ::raise(mode == "fault" ? SIGKILL : SIGSTOP);
        }
      }
    }
    if (mode == "scaler") {
      std::printf("rank %lld: skipped steps:%s; scale %g\n", static_cast<long long>(rank), skipped.c_str(),
                  scaler.get_scale());
    }
    std::printf("rank %lld: buckets %zu, started during backward %lld\n", static_cast<long long>(rank),
                ddp.bucket_indices().size(), static_cast<long long>(ddp.buckets_started_early()));
    std::printf("rank %lld: backward all-reduces: %lld (%lld bytes) under no_sync, %lld (%lld bytes) synchronising\n",
                static_cast<long long>(rank), static_cast<long long>(comm_no_sync.all_reduces),
                static_cast<long long>(comm_no_sync.all_reduce_bytes), static_cast<long long>(comm_sync.all_reduces),
                static_cast<long long>(comm_sync.all_reduce_bytes));
    if (zero) {
      std::printf("rank %lld: optimizer state %lld bytes (shard of %zu parameters)\n", static_cast<long long>(rank),
                  static_cast<long long>(zero->local_state_bytes()), zero->shard(rank).size());
      // Sharded checkpoint round trip: save, load into a fresh ZeRO over the same parameters, save again.
      auto serialized = [](const trainkit::dist::ZeroRedundancyOptimizer& z) {
        torch::serialize::OutputArchive archive;
        z.save(archive);
        std::ostringstream out;
        archive.save_to(out);
        return out.str();
      };
      const std::string first = serialized(*zero);
      trainkit::dist::ZeroRedundancyOptimizer fresh(
          net->parameters(), pg, [](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
            return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
          });
      std::istringstream in(first);
      torch::serialize::InputArchive archive;
      archive.load_from(in);
      fresh.load(archive);
      std::printf("rank %lld: zero checkpoint round trip %s\n", static_cast<long long>(rank),
                  serialized(fresh) == first && fresh.local_state_bytes() == zero->local_state_bytes() ? "equal"
                                                                                                   : "DIFFERS");
    }
    torch::save(td::snapshot(*holder), out + "/rank" + std::to_string(rank) + ".pt");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_worker: rank %lld: %s\n", static_cast<long long>(rank), e.what());
    std::fflush(stderr);
    // Leave at once: a c10d backend whose peer is gone may block in its destructor.
    ::_exit(3);
  }
  return 0;
}
