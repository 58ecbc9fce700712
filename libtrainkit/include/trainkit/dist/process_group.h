#pragma once
/// @file
/// Process groups on PyTorch's c10d (TCPStore rendezvous, a backend per device type: Gloo for CPU tensors in
/// every group, and NCCL, or a backend registered in trainkit/dist/backend.h, for the tensors of a device),
/// initialised from torchrun's environment or explicit arguments. c10d's headers stay in one source file:
/// this header only needs ATen.
///
///     auto pg = trainkit::dist::ProcessGroup::from_env();        // RANK, WORLD_SIZE, MASTER_ADDR, ...
///     double mean_loss = pg->all_reduce_mean(local_loss);         // every rank gets the mean
///     if (pg->is_main()) { /* write logs, checkpoints */ }
///
/// World size 1 makes no store, no backend and no threads: every collective returns at once.

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "trainkit/options.h"

namespace trainkit::dist {

/// A bad distributed setting (missing or inconsistent RANK/WORLD_SIZE, port in use, unknown backend).
class DistError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// How to join a group. Defaults are torchrun's (MASTER_ADDR=127.0.0.1, MASTER_PORT=29500).
struct InitOptions {
  /// This process's rank in [0, world_size).
  TORCH_ARG(int64_t, rank) = 0;
  /// Number of processes; 1 means no process group at all.
  TORCH_ARG(int64_t, world_size) = 1;
  /// Rank on this machine (selects `cuda:<local_rank>` for NCCL).
  TORCH_ARG(int64_t, local_rank) = 0;
  /// Address of rank 0's TCPStore.
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  /// Port of rank 0's TCPStore, 1..65535.
  TORCH_ARG(int64_t, master_port) = 29500;
  /// Backends by device type (parse_backend in trainkit/dist/backend.h): every group has Gloo for CPU
  /// tensors; "gloo": nothing else; "nccl" (= PyTorch's "cpu:gloo,cuda:nccl"; needs a CUDA LibTorch): NCCL
  /// for CUDA tensors; "auto": "nccl" when CUDA is available, else "gloo"; "<device>:<name>" a registered
  /// backend for that device type's tensors.
  TORCH_ARG(std::string, backend) = "auto";
  /// Timeout of the rendezvous and of every collective: a peer that hangs makes collectives throw then.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(30 * 60 * 1000);

 public:
  /// The options a config sets, by key, with their rules and help (`trainkit train`'s [distributed]; the
  /// ranks and the address come from the launcher's environment).
  static const OptionBinding<InitOptions>& binding() {
    static const auto b =
        OptionBinding<InitOptions>()
            .bind(TRAINKIT_OPTION(backend), rule::one_of({"auto", "gloo", "nccl"}),
                  "Under `trainkit launch`/torchrun: c10d backend (auto: Gloo, NCCL for CUDA)")
            .bind(TRAINKIT_OPTION(timeout), rule::seconds(positive()),
                  "Seconds a collective (or the rendezvous) waits for the other ranks before failing");
    return b;
  }
};

/// Reads torchrun's variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, and the optional
/// TRAINKIT_DIST_TIMEOUT (seconds) and TRAINKIT_DIST_BACKEND. With neither RANK nor WORLD_SIZE set it
/// returns world size 1; with only one of them, or inconsistent values, it throws DistError naming the
/// variable and its value.
InitOptions options_from_env();

/// A pending collective; wait() blocks and rethrows the peer's error (connection reset, timeout).
class Work {
 public:
  struct Impl;
  Work() = default;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  /// Blocks until done; throws DistError naming the collective and the cause on failure.
  void wait();
  /// True once wait() would not block (always for a completed or empty Work).
  bool completed() const;

 private:
  std::shared_ptr<Impl> impl_;
};

/// Reduction of all_reduce.
enum class ReduceOp { SUM, AVG, MAX, MIN };

/// What a group has sent since it was made: collectives started by this rank (world size > 1 only: a
/// group of one sends nothing) and the bytes of the tensors they carried. Barriers count as the one-element
/// all-reduce they are.
struct CommStats {
  int64_t all_reduces = 0;
  int64_t all_reduce_bytes = 0;
  int64_t broadcasts = 0;
  int64_t broadcast_bytes = 0;
  /// Reduces to one root (ZeRO-2's gradient buckets) and their bytes.
  int64_t reduces = 0;
  int64_t reduce_bytes = 0;
};

/// A group of processes and its c10d backends. Collectives must be called in the same order on every rank.
class ProcessGroup {
 public:
  struct Impl;
  /// Joins (world size > 1) or makes the trivial group (world size 1). Rank 0 hosts the TCPStore.
  static std::shared_ptr<ProcessGroup> init(const InitOptions& options);
  /// init(options_from_env()).
  static std::shared_ptr<ProcessGroup> from_env();
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int64_t rank() const { return options_.rank(); }
  int64_t world_size() const { return options_.world_size(); }
  int64_t local_rank() const { return options_.local_rank(); }
  /// rank() == 0: the rank that logs and writes checkpoints.
  bool is_main() const { return options_.rank() == 0; }
  /// The options the group was made with.
  const InitOptions& options() const { return options_; }
  /// Name of the backend for tensors on `device`: "gloo" for the CPU, the device backend's name ("nccl" ...)
  /// for any other device, "(none for <device>)" when the group has no device backend, "none" for world
  /// size 1.
  std::string backend_name(const c10::Device& device) const;

  /// Starts an in-place all-reduce of one contiguous tensor: a CPU tensor through Gloo, any other through the
  /// device backend (as every collective here). AVG divides by the world size after the sum.
  Work all_reduce(at::Tensor tensor, ReduceOp op = ReduceOp::SUM);
  /// Starts an in-place reduce (sum) of one contiguous tensor to `root`: only `root`'s tensor holds the sum
  /// afterwards (the others' content is unspecified).
  Work reduce(at::Tensor tensor, int64_t root);
  /// Starts an in-place broadcast of one contiguous tensor from `root`.
  Work broadcast(at::Tensor tensor, int64_t root = 0);
  /// Broadcasts `tensors` (any layout, dtypes, shapes) from `root` in place, one flat message per
  /// dtype and device, and waits.
  void broadcast_tensors(const std::vector<at::Tensor>& tensors, int64_t root = 0);
  /// Blocks until every rank got here (or throws at the timeout / when a peer is gone).
  void barrier();

  /// Mean of `value` over ranks (e.g. the loss), on every rank.
  double all_reduce_mean(double value);
  /// Element-wise mean of `values` over ranks (e.g. {loss, accuracy}), on every rank.
  std::vector<double> all_reduce_mean(const std::vector<double>& values);
  /// Sum of `value` over ranks.
  double all_reduce_sum(double value);
  /// Rank `root`'s `value` on every rank (e.g. a decision to stop).
  double broadcast_value(double value, int64_t root = 0);
  /// Collectives this rank started so far (e.g. to check that DDP's no_sync sends nothing). Safe to call
  /// while collectives start on other threads.
  CommStats stats() const;

  /// Rank `root`'s flag on every rank.
  bool broadcast_flag(bool flag, int64_t root = 0) { return broadcast_value(flag ? 1.0 : 0.0, root) != 0.0; }

 private:
  explicit ProcessGroup(InitOptions options);
  InitOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainkit::dist
