#pragma once
/// @file
/// A loader for map-style data sets whose samples cost work (decode, augment): worker threads load and
/// collate whole batches ahead of the consumer, and the batches come out in order, identical to loading
/// them in the calling thread.
///
///   data::ParallelLoader loader(n, [&](int64_t i, at::Generator& gen) {
///         at::Tensor image = decode(files[i]);                              // the per-sample work
///         if (torch::rand({1}, gen).item<double>() < 0.5) image = image.flip(-1);  // seeded augmentation
///         return data::Batch(image, labels[i]);                             // one sample, no batch dim
///       },
///       data::ParallelLoaderOptions().batch_size(64).num_workers(4).seed(0));
///   loader.set_epoch(epoch);
///   while (auto batch = loader.next()) { ... }
///
/// The epoch's sample order is TensorLoader's for the same options (randperm seeded seed + epoch, then
/// DistributedSampler's sharding), and each sample's generator is seeded from (seed, epoch, index), so
/// the batches, random augmentation included, do not depend on num_workers and a resumed run
/// (set_epoch + skip) sees exactly the batches it would have seen.

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Generator.h>
#include <torch/arg.h>

#include "trainkit/data/batch_source.h"
#include "trainkit/data/sampler.h"
#include "trainkit/data/torch_data.h"
#include "trainkit/options.h"

namespace trainkit::data {

/// Options of a ParallelLoader: the sampler fields of TensorLoaderOptions (data/sampler.h; `seed` also seeds
/// the per-sample generators) and the workers.
struct ParallelLoaderOptions : BasicSamplerOptions<ParallelLoaderOptions> {
  /// Worker threads loading batches (0: each batch is loaded in the thread that calls next()).
  TORCH_ARG(int64_t, num_workers) = 0;
  /// Batches in flight per worker (PyTorch's DataLoader `prefetch_factor`): at most
  /// num_workers * prefetch_factor batches are loaded or loading ahead of the consumer.
  TORCH_ARG(int64_t, prefetch_factor) = 2;
  /// Collate each batch into page-locked host memory (in the worker), so that a later
  /// `Batch::to(cuda, non_blocking=true)` copies asynchronously. Needs a CUDA device: the constructor
  /// throws std::invalid_argument when none is available.
  TORCH_ARG(bool, pin_memory) = false;

 public:
  /// The workers' keys, rules and help (trainkit/options.h); the sampler's fields are the program's.
  static const OptionBinding<ParallelLoaderOptions>& binding() {
    // At most 1024 threads, far above any machine's cores: a typo (an extra zero or three) is refused
    // naming its key instead of ending in thread exhaustion.
    static const auto b = OptionBinding<ParallelLoaderOptions>()
        .bind(TRAINKIT_OPTION(num_workers), rule::integer(0, 1024),
              "Loader worker threads preparing training batches (0 = in the training thread)")
        .bind(TRAINKIT_OPTION(prefetch_factor), rule::integer(1, 1024), "Batches in flight per loader worker");
    return b;
  }
};

/// Epochs of batches of a map-style data set, loaded by worker threads (see the file comment).
///
/// Threads: the workers start with the loader and live until it is destroyed (PyTorch's
/// `persistent_workers`). Each runs with one intra-op thread (`at::set_num_threads(1)` in that thread,
/// like PyTorch's DataLoader workers), so N workers calling ATen ops do not each start a team of as many
/// threads as there are cores; the calling thread's setting, and the default of threads started later,
/// stay as they were. Workers run with autograd off. The sample and collate functions are called
/// concurrently from several workers: they must be safe to call so (reading shared data is).
///
/// Errors: an exception thrown by the sample or collate function is rethrown from next() for the batch
/// it belongs to, as std::runtime_error "ParallelLoader: epoch E, batch B (sample I): <what>" with the
/// original nested (std::rethrow_if_nested); the cursor has then moved past that batch.
class ParallelLoader : public BatchSource {
 public:
  /// Sample `index` of the data set (a Batch whose tensors lack the batch dimension). `generator` is a
  /// CPU generator seeded from (seed, epoch, index): draw any random augmentation from it.
  using SampleFn = std::function<Batch(int64_t index, at::Generator& generator)>;
  /// Collates one batch's samples, in order.
  using CollateFn = std::function<Batch(const std::vector<Batch>& samples)>;

  /// A loader over samples 0..size-1. Throws std::invalid_argument naming the option for an empty data
  /// set, a missing function or an invalid option.
  ParallelLoader(int64_t size, SampleFn sample, ParallelLoaderOptions options = {},
                 CollateFn collate = collate_stack);
  /// Stops and joins the workers (work in flight is abandoned after its current sample).
  ~ParallelLoader() override;
  ParallelLoader(const ParallelLoader&) = delete;
  ParallelLoader& operator=(const ParallelLoader&) = delete;

  /// Selects the order of `epoch` and restarts at its first batch; work in flight for the previous epoch
  /// is cancelled. Loading starts at the next call of next().
  void set_epoch(int64_t epoch) override;
  /// The epoch last selected with set_epoch.
  int64_t epoch() const { return epoch_; }
  /// The next batch of the epoch, or std::nullopt after the last. Blocks until a worker has loaded it.
  std::optional<Batch> next() override;
  /// Moves the cursor without loading the skipped batches (O(1)).
  void skip(int64_t count) override;
  /// Number of batches per epoch.
  int64_t num_batches() const override { return num_batches_; }
  /// Number of samples (of all shards).
  int64_t size() const { return size_; }
  /// The options given at construction.
  const ParallelLoaderOptions& options() const { return options_; }

 private:
  struct Slot {
    Batch batch;
    std::exception_ptr error;
    std::string where;  // "sample I" or "collate" for an error
  };

  // Loads and collates the samples `indices` of `epoch`; `cancelled` is polled between samples.
  Slot load(int64_t epoch, const std::vector<int64_t>& indices, const std::function<bool()>& cancelled) const;
  std::vector<int64_t> indices_of(int64_t index) const;
  void worker_loop();
  bool can_dispatch() const;
  [[noreturn]] void rethrow(const Slot& slot, int64_t index) const;

  int64_t size_;
  SampleFn sample_;
  CollateFn collate_;
  ParallelLoaderOptions options_;
  int64_t num_batches_ = 0;

  // Guarded by mutex_ (written only by the consumer's thread, read by workers under the lock).
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;   // workers wait for a batch to load
  std::condition_variable ready_cv_;  // the consumer waits for its batch
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;  // this rank's sample indices of the epoch
  int64_t cursor_ = 0;          // the batch next() returns next
  int64_t dispatched_ = 0;      // the next batch a worker takes
  uint64_t generation_ = 0;     // bumped by set_epoch: results of older generations are dropped
  bool active_ = false;         // loading runs between the first next() of an epoch and set_epoch
  bool stop_ = false;
  std::map<int64_t, Slot> ready_;  // loaded batches >= cursor_, by index
  std::vector<std::thread> workers_;
};

/// A SampleFn over a `torch::data` map-style data set (`get(size_t)` returning `Example<>` or an
/// unlabelled example, `size()`), which the caller keeps alive; pass `*dataset.size()` as the size.
/// Its `get` is called from several workers at once.
template <class Dataset>
ParallelLoader::SampleFn from_dataset(Dataset& dataset) {
  return [&dataset](int64_t index, at::Generator&) { return to_batch(dataset.get(static_cast<size_t>(index))); };
}

}  // namespace trainkit::data
