#pragma once
/// @file
/// The one interface through which the Trainer, the LR finder and the batch-size finder read data:
/// epochs of batches. Adapters exist for preloaded tensors (TensorLoader), any `torch::data` data loader
/// (data/torch_data.h), worker-thread loading (ParallelLoader) and a user callable (FunctionSource).
///
///   class MySource : public trainkit::data::BatchSource {
///     void set_epoch(int64_t e) override { ... }          // restart at the epoch's first batch
///     std::optional<Batch> next() override { ... }       // std::nullopt ends the epoch
///   };

#include <cstdint>
#include <functional>
#include <optional>

#include "trainkit/data/batch.h"

namespace trainkit::data {

/// Epochs of batches. Resuming mid-epoch is set_epoch(e) then skip(b): a source whose epoch order
/// depends only on its seed and the epoch number resumes bitwise (every source of trainkit does).
class BatchSource {
 public:
  /// What num_batches() returns when the length of an epoch is not known in advance.
  static constexpr int64_t kUnknownLength = -1;

  virtual ~BatchSource() = default;
  /// Starts epoch `epoch` (0-based) at its first batch.
  virtual void set_epoch(int64_t epoch) = 0;
  /// The next batch of the current epoch, or std::nullopt when the epoch is done.
  virtual std::optional<Batch> next() = 0;
  /// Batches per epoch when known before iterating, else kUnknownLength (an iterable of unknown length).
  virtual int64_t num_batches() const { return kUnknownLength; }
  /// Skips the next `count` batches of the epoch (to resume). The default reads and drops them; sources
  /// with random access skip without loading.
  virtual void skip(int64_t count);
};

/// A BatchSource over a callable: `fn(epoch, index)` returns batch `index` of `epoch`, or std::nullopt
/// after the epoch's last batch.
class FunctionSource : public BatchSource {
 public:
  using Fn = std::function<std::optional<Batch>(int64_t epoch, int64_t index)>;
  /// `num_batches`, when given, is what num_batches() reports, and the epoch ends there.
  explicit FunctionSource(Fn fn, int64_t num_batches = kUnknownLength);
  void set_epoch(int64_t epoch) override;
  std::optional<Batch> next() override;
  int64_t num_batches() const override { return num_batches_; }
  /// Skips without calling the function.
  void skip(int64_t count) override;

 private:
  Fn fn_;
  int64_t num_batches_;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
};

/// The same batches every epoch, in order (e.g. a fixed validation set that fits in memory).
FunctionSource from_batches(std::vector<Batch> batches);

}  // namespace trainkit::data
