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

/// Keeps numbered checkpoints `ckpt-<step>.tkpt` in one directory and deletes all but the newest K.
class CheckpointManager {
 public:
  /// Checkpoints go to `dir` (created on first save); `keep_last` >= 1 of them are kept.
  CheckpointManager(std::string dir, int64_t keep_last);

  /// Saves the checkpoint of `step` atomically, then prunes old ones and the temporary files that writers
  /// killed mid-save left behind (those of processes that no longer run). Returns its path.
  std::string save(int64_t step, torch::serialize::OutputArchive& archive);
  /// Checkpoint files in the directory, oldest step first (temporary files are ignored).
  std::vector<std::string> list() const;
  /// Loads the newest checkpoint that verifies into `archive` and returns its path, skipping (and
  /// logging) damaged ones; std::nullopt when there is none.
  std::optional<std::string> load_latest(torch::serialize::InputArchive& archive) const;
  /// Sets a hook run before each rename (see write_file_atomic); for fault-injection tests.
  void set_before_rename(std::function<void()> hook) { before_rename_ = std::move(hook); }
  /// The checkpoint directory.
  const std::string& dir() const { return dir_; }

 private:
  void remove_stale_temporaries() const;

  std::string dir_;
  int64_t keep_last_;
  std::function<void()> before_rename_;
};

}  // namespace trainkit::train
