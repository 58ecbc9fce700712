#pragma once
/// @file
/// The batch-size finder with PyTorch Lightning's semantics (`Tuner.scale_batch_size`): try a few
/// training steps at growing batch sizes until one fails for memory, then back off ("power") or bisect
/// ("binsearch"); plus a "throughput" mode that measures samples/s at every size that fits and picks the
/// fastest. Model, optimizer and RNG state are restored afterwards, as by the LR finder.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "trainkit/data/batch_source.h"
#include "trainkit/train/task.h"

namespace trainkit::tune {

/// Options of the search (Lightning's names and defaults).
struct BatchSizeFinderOptions {
  /// "power" (double until a size fails, answer the last that fit), "binsearch" (double until a size
  /// fails, then bisect between the last that fit and the first that failed) or "throughput" (double
  /// until a size fails, answer the size with the most samples/s).
  TORCH_ARG(std::string, mode) = "power";
  /// Optimizer steps tried at each size (>= 1).
  TORCH_ARG(int64_t, steps_per_trial) = 3;
  /// First size tried (>= 1).
  TORCH_ARG(int64_t, init_val) = 2;
  /// Most trials that succeed before the search stops (>= 1).
  TORCH_ARG(int64_t, max_trials) = 25;
  /// Largest size tried; 0 = the number of training samples (sizes are always capped by it).
  TORCH_ARG(int64_t, max_val) = 0;
  /// CPU only: a trial fails when the resident memory it adds at its peak exceeds this many bytes
  /// (0 = no budget: only a real out-of-memory error fails a trial). See PeakRssProbe.
  TORCH_ARG(int64_t, memory_budget) = 0;
};

/// One tried batch size.
struct BatchSizeTrial {
  int64_t batch_size = 0;
  bool fits = false;
  /// Training samples per second over the trial's steps after the first (all steps when there is one).
  double samples_per_second = 0;
  /// Peak memory the trial added (bytes): resident memory on CPU, the caching allocator's peak
  /// allocated bytes on CUDA; -1 when not measured.
  int64_t peak_bytes = -1;
  /// Why it failed ("" when it fit).
  std::string failure;
};

/// What the search tried and found.
struct BatchSizeFinderResult {
  int64_t batch_size = 0;  ///< the answer
  std::string mode;
  std::vector<BatchSizeTrial> trials;  ///< in the order tried
};

/// Measures the memory a trial adds at its peak. A test double can fail trials deterministically.
class MemoryProbe {
 public:
  virtual ~MemoryProbe() = default;
  /// Called before a trial of `batch_size` samples per step.
  virtual void begin(int64_t batch_size) = 0;
  /// Called after it: the peak bytes added since begin().
  virtual int64_t end() = 0;
};

/// The process's peak resident memory (Linux): begin() returns freed memory to the system (the host
/// cache's idle blocks, train::empty_host_cache, and then malloc_trim), resets the kernel's high-water
/// mark VmHWM by writing "5" to /proc/self/clear_refs and reads VmRSS; end() returns VmHWM - that VmRSS. Peak RSS never decreases on its own, so without the
/// reset a trial smaller than an earlier one would read the earlier peak; where clear_refs cannot be
/// written (old kernels, some sandboxes), a thread samples VmRSS every millisecond instead.
class PeakRssProbe : public MemoryProbe {
 public:
  PeakRssProbe();
  ~PeakRssProbe() override;
  void begin(int64_t batch_size) override;
  int64_t end() override;
  /// Whether the VmHWM reset works here (false: sampling).
  bool resets_high_water_mark() const { return reset_works_; }

 private:
  struct Sampler;
  bool reset_works_ = false;
  int64_t base_ = 0;
  std::unique_ptr<Sampler> sampler_;
};

/// Reads /proc/self/status: the value of `key` ("VmRSS", "VmHWM") in bytes; -1 if unavailable.
int64_t proc_status_bytes(const std::string& key);

/// Finds the largest (or fastest) batch size a model trains with.
class BatchSizeFinder {
 public:
  using ForwardFn = train::ForwardFn;
  using LossFn = train::LossFn;
  /// Makes a source whose batches have `batch_size` samples (e.g. the user's loader built with that
  /// batch size).
  using SourceFactory = std::function<std::unique_ptr<data::BatchSource>(int64_t batch_size)>;

  /// `forward` maps a batch to the output; the loss defaults to cross-entropy.
  BatchSizeFinder(std::shared_ptr<torch::nn::Module> module, ForwardFn forward, torch::optim::Optimizer& optimizer,
                  LossFn loss = nullptr);
  /// Convenience for module holders with a `forward(Tensor)`: the forward runs on the batch's input 0.
  template <class Holder>
  BatchSizeFinder(Holder model, torch::optim::Optimizer& optimizer, LossFn loss = nullptr)
      : BatchSizeFinder(model.ptr(), train::forward_first_input(model), optimizer, std::move(loss)) {}

  /// Replaces the CPU memory probe (default: PeakRssProbe, used only when memory_budget > 0).
  void set_memory_probe(std::shared_ptr<MemoryProbe> probe) { probe_ = std::move(probe); }

  /// Runs the search on `inputs`/`targets` (first dimension = samples; a trial's steps take consecutive
  /// slices, wrapping around). Each trial starts from the state at the call, so each measures the same
  /// thing (the optimizer state created by the first step included). A trial fails on
  /// c10::OutOfMemoryError (CUDA; the caching allocator is emptied), on a CPU allocation failure, or when
  /// the probe reports more than memory_budget bytes. Parameters, buffers, optimizer state and every
  /// device's default generator (the CPU's, each GPU's) are restored bitwise afterwards, also when the
  /// search throws. Throws std::invalid_argument for bad
  /// options or data and std::runtime_error when not even batch size 1 fits.
  BatchSizeFinderResult scale_batch_size(const at::Tensor& inputs, const at::Tensor& targets,
                                         const BatchSizeFinderOptions& options = {});
  /// The same search over any data: each trial reads its steps from `make_source(size)` (from epoch 0,
  /// into later epochs when one is too short). `num_samples` caps the sizes tried, as the sample count
  /// does above. Memory is measured on the device of the module's first parameter.
  BatchSizeFinderResult scale_batch_size(const SourceFactory& make_source, int64_t num_samples,
                                         const BatchSizeFinderOptions& options = {});

 private:
  BatchSizeTrial run_trial(const SourceFactory& make_source, int64_t batch_size, const BatchSizeFinderOptions& options);

  std::shared_ptr<torch::nn::Module> module_;
  ForwardFn forward_;
  torch::optim::Optimizer& optimizer_;
  LossFn loss_;
  std::shared_ptr<MemoryProbe> probe_;
};

}  // namespace trainkit::tune
