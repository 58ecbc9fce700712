#pragma once
/// @file
/// Versioned, checksummed checkpoint files written atomically, and a manager that keeps the last K.
///
/// File layout (little endian): magic "TKCKPT\r\n" (8 bytes), u32 format version, u32 flags (0),
/// u64 payload size, u32 CRC-32 of the payload, u32 reserved (0), then the payload: a LibTorch
/// `torch::serialize::OutputArchive`. A truncated or corrupted file fails the size or CRC check.

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

namespace trainkit::train {

/// Raised for an unreadable, truncated, corrupted or incompatible checkpoint; what() names the file.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The format version this build writes (and the newest it reads).
constexpr uint32_t kCheckpointFormatVersion = 1;

/// Writes `bytes` to `path` atomically: a temporary file in the same directory is written, flushed and
/// fsync'ed, renamed over `path`, then the directory is fsync'ed. `before_rename`, when set, runs
/// between the fsync and the rename (a fault-injection point for tests); if it throws, the temporary file
/// is removed and `path` is untouched.
void write_file_atomic(const std::string& path, const std::string& bytes,
                       const std::function<void()>& before_rename = {});

/// Saves `archive` to `path` as a checkpoint file, atomically (see write_file_atomic).
void save_checkpoint(const std::string& path, torch::serialize::OutputArchive& archive,
                     const std::function<void()>& before_rename = {});

/// Reads and verifies the checkpoint at `path` into `archive` (size, CRC-32, and an archive of data only:
/// one whose TorchScript sources define anything but attributes is refused before it loads); throws
/// CheckpointError naming the file.
void load_checkpoint(const std::string& path, torch::serialize::InputArchive& archive);

/// Writes the parameters and buffers of `module` to `path` as `torch::save(module, path)` does (a LibTorch
/// OutputArchive, read back by `torch::load(module, path)`), atomically (see write_file_atomic).
void save_weights(const torch::nn::Module& module, const std::string& path);

/// What a checkpoint of Trainer::save holds, reduced to numbers that compare runs with each other.
struct CheckpointDigest {
  int64_t epoch = -1;  ///< the trainer position (-1 when the checkpoint has none)
  int64_t batch = -1;
  int64_t step = -1;
  int64_t tensors = 0;  ///< model tensors digested
  /// FNV-1a 64 over the model's tensors (names sorted; name, dtype, shape and bytes of each), the position
  /// and the CPU RNG state.
  uint64_t digest = 0;
};

/// Verifies the checkpoint at `path` (as load_checkpoint does) and digests its model (every tensor under
/// "model"), trainer position and CPU RNG state: equal digests mean bitwise-equal models at the same
/// position with the same RNG. The optimizer's state is not digested, because LibTorch keys it by tensor
/// address, which differs from process to process (a wrong optimizer state still shows in the next
/// checkpoints' models). Throws CheckpointError naming the file.
CheckpointDigest digest_checkpoint(const std::string& path);

/// FNV-1a 64 over `module`'s parameters, as CheckpointDigest hashes a checkpoint's model (names sorted;
/// name, dtype, shape and bytes of each): equal digests mean bitwise-equal parameters, e.g. of the replicas of
/// data-parallel ranks after the same steps. Buffers are left out: each rank updates its BatchNorm statistics
/// from its own batch.
uint64_t digest_parameters(const torch::nn::Module& module);

/// The ranks that write one checkpoint together, and how they exchange numbers (dist::checkpoint_group
/// makes one from a dist::ProcessGroup). The default is a single process.
struct CheckpointGroup {
  int64_t rank = 0;
  int64_t world_size = 1;
  /// Every rank's `values` (any length), in rank order, on every rank; a collective: every rank calls it
  /// at the same point. Unset for a single process.
  std::function<std::vector<std::vector<int64_t>>(const std::vector<int64_t>& values)> all_gather;
};

/// One complete checkpoint of a directory: a whole checkpoint file, or the shards of every rank of a step
/// under the commit record that rank 0 wrote once every shard was durable.
struct CheckpointEntry {
  int64_t step = -1;
  /// By rank: the one file of a whole checkpoint, or every rank's shard.
  std::vector<std::string> files;
  /// The commit record (`ckpt-<step>.commit`); empty for a whole checkpoint.
  std::string commit;
  /// The number of ranks that wrote it (1 for a whole checkpoint).
  int64_t world_size() const { return static_cast<int64_t>(files.size()); }
  /// The file rank `rank` of a `world_size`-rank run restores from: its own shard when the world sizes
  /// are equal, else rank 0's (whose model, position and RNG every rank then shares).
  const std::string& file_for(int64_t rank, int64_t world_size) const {
    return files.at(static_cast<size_t>(world_size == this->world_size() ? rank : 0));
  }
  /// What a log names: the commit record, or the file.
  const std::string& name() const { return commit.empty() ? files.front() : commit; }
};

/// Keeps numbered checkpoints in one directory and deletes all but the newest K: whole checkpoints
/// `ckpt-<step>.tkpt`, or (sharded, several ranks) each rank's shard `ckpt-<step>.rank<r>-of-<W>.tkpt`
/// under a commit record `ckpt-<step>.commit`.
///
/// A sharded save is a two-phase commit: every rank writes its shard atomically (fsync'ed), the ranks
/// all-gather (step, size, CRC-32), rank 0 checks that it sees every shard with that size and writes the
/// commit record atomically (step, world size, a random token, each shard's name, size and CRC), and every
/// other rank checks that it sees that record with that token. A step without its commit record does not
/// count; shards older than the newest commit and not kept are deleted. The ranks must share the
/// directory: one that they do not share makes the first save fail on every rank with an error naming the
/// ranks that do not see the others' files.
class CheckpointManager {
 public:
  /// Checkpoints go to `dir` (created on first save); `keep_last` >= 1 of them are kept.
  CheckpointManager(std::string dir, int64_t keep_last);

  /// Makes every save a shard of `group`'s rank, committed across the ranks (see above); every rank then
  /// calls save() at the same steps. A group of one process keeps whole checkpoints.
  void set_sharded(CheckpointGroup group);

  /// Saves the checkpoint of `step` atomically (sharded: this rank's shard, then the commit), then prunes
  /// old ones and the temporary files that writers killed mid-save left behind (those of processes that no
  /// longer run). Returns the path of the file written.
  std::string save(int64_t step, torch::serialize::OutputArchive& archive);
  /// Whole checkpoint files and commit records in the directory, oldest step first (temporary files and
  /// uncommitted shards are ignored).
  std::vector<std::string> list() const;
  /// The complete checkpoints, oldest step first: whole files and commit records whose shards exist with
  /// the recorded sizes (files are not read; latest() verifies them).
  std::vector<CheckpointEntry> entries() const;
  /// The newest checkpoint whose every file verifies (size, CRC-32 against the commit record), skipping
  /// (and logging) damaged ones; std::nullopt when there is none.
  std::optional<CheckpointEntry> latest() const;
  /// Loads the newest checkpoint that verifies into `archive` (a sharded one: rank 0's shard) and returns
  /// its path, skipping (and logging) damaged ones; std::nullopt when there is none.
  std::optional<std::string> load_latest(torch::serialize::InputArchive& archive) const;
  /// Sets a hook run before each rename (see write_file_atomic); for fault-injection tests.
  void set_before_rename(std::function<void()> hook) { before_rename_ = std::move(hook); }
  /// The checkpoint directory.
  const std::string& dir() const { return dir_; }

 private:
  void remove_stale_temporaries() const;
  std::string save_shard(int64_t step, torch::serialize::OutputArchive& archive);
  void prune(const std::vector<std::string>& keep_names) const;

  std::string dir_;
  int64_t keep_last_;
  std::function<void()> before_rename_;
  CheckpointGroup group_;
  bool sharded_ = false;
};

/// The sharded checkpoint that commit record `path` (`ckpt-<step>.commit`) names, verified: every shard
/// beside it with its recorded size and CRC-32, each readable. Throws CheckpointError naming the record or
/// the shard that fails.
CheckpointEntry verify_commit(const std::string& path);

/// Checks that every rank of `group` resumes from the same checkpoint step (`step` = -1: none found):
/// all-gathers the steps and throws CheckpointError naming each rank's step when they differ (on every
/// rank alike, before any of them loads). `dir` is named in the message. No-op for a single process.
void check_same_checkpoint(int64_t step, const std::string& dir, const CheckpointGroup& group);

}  // namespace trainkit::train
