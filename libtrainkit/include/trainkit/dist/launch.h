#pragma once
/// @file
/// A launcher compatible with torchrun's environment (`trainkit launch`): starts `nproc` copies of a command
/// on this machine with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, MASTER_ADDR,
/// MASTER_PORT and TORCHELASTIC_RESTART_COUNT set, prefixes every output line with `[rank N] `, forwards
/// SIGINT/SIGTERM/SIGHUP to the ranks, and when one rank fails stops the others, reports which rank failed
/// and how, and restarts every rank up to max_restarts times (torchrun's elastic agent on one machine).
/// Each rank runs in a session and process group of its own, which every signal the launcher sends reaches
/// whole; a launcher killed outright (SIGKILL) takes the groups along through a ProcessGroupGuard, and each
/// rank has SIGKILL as its parent-death signal.
/// Several machines: one launcher per machine with the same nnodes, master_addr and master_port and its own
/// node_rank (torchrun's static rendezvous); machine k's ranks are k * nproc ... (k + 1) * nproc - 1.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/arg.h>

namespace trainkit::dist {

/// Options of launch().
struct LaunchOptions {
  /// Processes to start on this machine (>= 1).
  TORCH_ARG(int64_t, nproc) = 1;
  /// Machines in the job (torchrun's --nnodes), each running one launcher with the same nproc.
  TORCH_ARG(int64_t, nnodes) = 1;
  /// This machine's index in 0 .. nnodes - 1 (torchrun's --node-rank); node 0 hosts rank 0 and its store.
  TORCH_ARG(int64_t, node_rank) = 0;
  /// MASTER_ADDR given to the ranks.
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  /// MASTER_PORT given to the ranks; 0 picks a free port (one machine only).
  TORCH_ARG(int64_t, master_port) = 29500;
  /// Seconds the other ranks get to exit after SIGTERM (once one failed) before SIGKILL.
  TORCH_ARG(double, grace_seconds) = 5.0;
  /// Prefix every output line with `[rank N] `.
  TORCH_ARG(bool, prefix_output) = true;
  /// OMP_NUM_THREADS for the ranks when it is not set already (torchrun's default, 1); 0 leaves it unset.
  TORCH_ARG(int64_t, omp_num_threads) = 1;
  /// When a rank fails, stop the others and start every rank again, at most this many times (torchrun's
  /// --max-restarts); each start sets TORCHELASTIC_RESTART_COUNT to its number (0 first) and
  /// TORCHELASTIC_MAX_RESTARTS. The command resumes itself (`trainkit train --resume auto`).
  TORCH_ARG(int64_t, max_restarts) = 0;
  /// The command and its arguments (searched in PATH).
  TORCH_ARG(std::vector<std::string>, command) = {};
};

/// Runs the ranks to completion. Returns 0 when all exit 0. When a rank fails, prints `launch: rank N ...`
/// naming it (exit code or signal) to stderr, stops the others and restarts all while restarts are left
/// (`launch: restarting all N ranks (restart k of M) ...`); then returns 1 after `launch: failed: rank N ...
/// (k of M restarts used)`, or 128+signal when the launcher itself was interrupted. Bad options (nproc < 1,
/// empty command, port in use, node_rank outside 0 .. nnodes - 1, port 0 or restarts with several machines)
/// throw std::invalid_argument with the culprit named.
int launch(const LaunchOptions& options);

/// A TCP port that is free on 127.0.0.1 right now (bind to port 0, read it back).
int64_t free_port();

/// Whether `port` can be bound on the local machine (i.e. is not in use).
bool port_is_free(int64_t port);

}  // namespace trainkit::dist
