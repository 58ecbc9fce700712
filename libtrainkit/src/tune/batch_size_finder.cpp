#include "trainkit/tune/batch_size_finder.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "trainkit/compat.h"
#include "trainkit/train/host_memory.h"
#include "tune/detail/snapshot.h"

// The device-generic caching-allocator interface (empty cache, peak statistics without CUDA headers).
// It is a version difference that belongs in compat.h, kept here because only this file needs it and
// compat.h is included by many translation units.
#if TRAINKIT_TORCH_AT_LEAST(2, 9)
#include <c10/core/CachingDeviceAllocator.h>
#define TRAINKIT_HAS_DEVICE_ALLOCATOR 1
#else
#define TRAINKIT_HAS_DEVICE_ALLOCATOR 0
#endif

namespace trainkit::tune {
namespace {

void empty_device_cache(const c10::Device& device) {
#if TRAINKIT_HAS_DEVICE_ALLOCATOR
  if (device.is_cuda() && torch::cuda::is_available()) {
    c10::getDeviceAllocator(device.type())->emptyCache();
  }
#else
  (void)device;
#endif
}

void reset_device_peak(const c10::Device& device) {
#if TRAINKIT_HAS_DEVICE_ALLOCATOR
  if (device.is_cuda()) {
    auto* allocator = c10::getDeviceAllocator(device.type());
    if (allocator->initialized()) {
      allocator->resetPeakStats(device.has_index() ? device.index() : 0);
    }
  }
#else
  (void)device;
#endif
}

int64_t device_peak_bytes(const c10::Device& device) {
#if TRAINKIT_HAS_DEVICE_ALLOCATOR
  if (device.is_cuda()) {
    auto* allocator = c10::getDeviceAllocator(device.type());
    if (allocator->initialized()) {
      const auto stats = allocator->getDeviceStats(device.has_index() ? device.index() : 0);
      return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
    }
  }
#else
  (void)device;
#endif
  return -1;
}

void check_options(const BatchSizeFinderOptions& o) {
  const auto bad = [](const std::string& name, int64_t v, const std::string& expected) {
    throw std::invalid_argument(fmt::format("BatchSizeFinder: invalid {}: {} ({})", name, v, expected));
  };
  if (o.mode() != "power" && o.mode() != "binsearch" && o.mode() != "throughput") {
    throw std::invalid_argument("BatchSizeFinder: invalid mode: \"" + o.mode() +
                                "\" (\"power\", \"binsearch\" or \"throughput\")");
  }
  if (o.steps_per_trial() < 1) bad("steps_per_trial", o.steps_per_trial(), "must be >= 1");
  if (o.init_val() < 1) bad("init_val", o.init_val(), "must be >= 1");
  if (o.max_trials() < 1) bad("max_trials", o.max_trials(), "must be >= 1");
  if (o.max_val() < 0) bad("max_val", o.max_val(), "must be >= 0 (0 = the number of samples)");
  if (o.memory_budget() < 0) bad("memory_budget", o.memory_budget(), "must be >= 0 bytes (0 = none)");
}

/// `n` consecutive samples from `start`, wrapping around the end.
at::Tensor take(const at::Tensor& t, int64_t start, int64_t n) {
  const int64_t size = t.size(0);
  start %= size;
  if (start + n <= size) {
    return t.narrow(0, start, n);
  }
  return torch::cat({t.narrow(0, start, size - start), t.narrow(0, 0, n - (size - start))});
}

/// The first line of an error message (LibTorch's carry long hints and backtraces).
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0)); }

}  // namespace

int64_t proc_status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = key + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) {
      std::istringstream fields(line.substr(prefix.size()));
      int64_t value = 0;
      std::string unit;
      fields >> value >> unit;
      return unit == "kB" ? value * 1024 : value;
    }
  }
  return -1;
}

/// Samples VmRSS every millisecond on a thread while a trial runs (fallback when VmHWM cannot be reset).
struct PeakRssProbe::Sampler {
  std::thread thread;
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::atomic<int64_t> peak{0};

  Sampler() {
    peak = proc_status_bytes("VmRSS");
    thread = std::thread([this] {
      std::unique_lock<std::mutex> lock(mutex);
      while (!wake.wait_for(lock, std::chrono::milliseconds(1), [this] { return stop; })) {
        const int64_t rss = proc_status_bytes("VmRSS");
        if (rss > peak) {
          peak = rss;
        }
      }
    });
  }
  ~Sampler() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    wake.notify_all();
    thread.join();
  }
};

PeakRssProbe::PeakRssProbe() {
  if (proc_status_bytes("VmRSS") < 0 || proc_status_bytes("VmHWM") < 0) {
    throw std::runtime_error("PeakRssProbe: /proc/self/status has no VmRSS/VmHWM (Linux only)");
  }
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  reset_works_ = static_cast<bool>(clear);
}

PeakRssProbe::~PeakRssProbe() = default;

void PeakRssProbe::begin(int64_t /*batch_size*/) {
  // Freed memory still counts as resident until returned; a trial reusing it would look free. The host
  // cache's idle blocks first (train.host_cache), then glibc's free pages.
  train::empty_host_cache();
  malloc_trim(0);
  if (reset_works_) {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // resets VmHWM to the current VmRSS (Linux >= 4.0)
    clear.flush();
    reset_works_ = static_cast<bool>(clear);
  }
  base_ = proc_status_bytes("VmRSS");
  if (!reset_works_) {
    sampler_ = std::make_unique<Sampler>();
  }
}

int64_t PeakRssProbe::end() {
  int64_t peak = 0;
  if (sampler_) {
    peak = std::max<int64_t>(sampler_->peak, proc_status_bytes("VmRSS"));
    sampler_.reset();
  } else {
    peak = proc_status_bytes("VmHWM");
  }
  return std::max<int64_t>(0, peak - base_);
}

BatchSizeFinder::BatchSizeFinder(std::shared_ptr<torch::nn::Module> module, ForwardFn forward,
                                 torch::optim::Optimizer& optimizer, LossFn loss)
    : module_(std::move(module)), forward_(std::move(forward)), optimizer_(optimizer), loss_(std::move(loss)) {
  if (!module_ || !forward_) {
    throw std::invalid_argument("BatchSizeFinder: module and forward must be given");
  }
  if (!loss_) {
    loss_ = train::cross_entropy_loss();
  }
}

BatchSizeTrial BatchSizeFinder::run_trial(const SourceFactory& make_source, int64_t batch_size,
                                          const BatchSizeFinderOptions& options) {
  using Clock = std::chrono::steady_clock;
  BatchSizeTrial trial;
  trial.batch_size = batch_size;
  const auto params = module_->parameters();
  const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
  const bool budgeted = options.memory_budget() > 0 && !device.is_cuda();
  if (budgeted && !probe_) {
    probe_ = std::make_shared<PeakRssProbe>();
  }
  MemoryProbe* probe = budgeted ? probe_.get() : nullptr;
  if (probe != nullptr) {
    probe->begin(batch_size);
  }
  reset_device_peak(device);
  try {
    module_->train();
    std::unique_ptr<data::BatchSource> source = make_source(batch_size);
    if (!source) {
      throw std::invalid_argument(fmt::format("BatchSizeFinder: the source factory returned null for batch size {}",
                                              batch_size));
    }
    int64_t epoch = 0;
    source->set_epoch(epoch);
    Clock::time_point timed_from;
    int64_t timed_samples = 0;
    for (int64_t s = 0; s < options.steps_per_trial(); ++s) {
      // The first step of several is warm-up (optimizer state, allocator growth): not timed.
      if (s == std::min<int64_t>(1, options.steps_per_trial() - 1)) {
        timed_from = Clock::now();
        timed_samples = 0;
      }
      std::optional<data::Batch> batch = source->next();
      if (!batch) {
        source->set_epoch(++epoch);
        batch = source->next();
        if (!batch) {
          throw std::invalid_argument(fmt::format("BatchSizeFinder: the source for batch size {} yielded no batch",
                                                  batch_size));
        }
      }
      optimizer_.zero_grad();
      const at::Tensor loss = loss_(forward_(*batch), *batch);
      loss.backward();
      optimizer_.step();
      (void)loss.item<double>();  // waits for the device, so the time is the step's
      timed_samples += batch->size();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - timed_from).count();
    trial.samples_per_second = seconds > 0 ? static_cast<double>(timed_samples) / seconds : 0.0;
    trial.fits = true;
  } catch (const c10::OutOfMemoryError& e) {
    trial.failure = "out of memory: " + first_line(e.what_without_backtrace());
  } catch (const c10::Error& e) {
    // Lightning's is_out_of_cpu_memory: the CPU allocator's failure is a c10::Error with this text.
    const std::string what = e.what_without_backtrace();
    if (what.find("DefaultCPUAllocator: can't allocate memory") == std::string::npos) {
      throw;
    }
    trial.failure = "out of memory: " + first_line(what);
  } catch (const std::bad_alloc&) {
    trial.failure = "out of memory: std::bad_alloc";
  }
  optimizer_.zero_grad();  // drop the gradients before measuring and before the next trial
  if (!trial.fits) {
    empty_device_cache(device);
  }
  if (probe != nullptr) {
    trial.peak_bytes = probe->end();
    if (trial.fits && trial.peak_bytes > options.memory_budget()) {
      trial.fits = false;
      trial.failure = fmt::format("peak resident memory grew by {}, over the budget of {}", mib(trial.peak_bytes),
                                  mib(options.memory_budget()));
    }
  } else if (device.is_cuda()) {
    trial.peak_bytes = device_peak_bytes(device);
  }
  if (trial.fits) {
    spdlog::debug("batch size {} fits: {:.0f} samples/s{}", batch_size, trial.samples_per_second,
                  trial.peak_bytes >= 0 ? ", peak " + mib(trial.peak_bytes) : "");
  } else {
    spdlog::debug("batch size {} failed: {}", batch_size, trial.failure);
  }
  return trial;
}

BatchSizeFinderResult BatchSizeFinder::scale_batch_size(const at::Tensor& inputs, const at::Tensor& targets,
                                                        const BatchSizeFinderOptions& options) {
  check_options(options);
  if (!inputs.defined() || !targets.defined() || inputs.dim() < 1 || targets.dim() < 1 ||
      inputs.size(0) != targets.size(0) || inputs.size(0) == 0) {
    throw std::invalid_argument(fmt::format(
        "BatchSizeFinder: inputs and targets need the same, non-zero number of samples (got {} and {})",
        inputs.defined() && inputs.dim() > 0 ? inputs.size(0) : 0, targets.defined() && targets.dim() > 0 ? targets.size(0) : 0));
  }
  const at::Tensor x = inputs;
  const at::Tensor y = targets;
  const SourceFactory slices = [x, y](int64_t batch_size) -> std::unique_ptr<data::BatchSource> {
    // Consecutive slices, wrapping around the samples.
    return std::make_unique<data::FunctionSource>([x, y, batch_size](int64_t, int64_t step) -> std::optional<data::Batch> {
      const int64_t start = step * batch_size;
      return data::Batch(take(x, start, batch_size), take(y, start, batch_size));
    });
  };
  return scale_batch_size(slices, inputs.size(0), options);
}

BatchSizeFinderResult BatchSizeFinder::scale_batch_size(const SourceFactory& make_source, int64_t num_samples,
                                                        const BatchSizeFinderOptions& options) {
  check_options(options);
  if (!make_source || num_samples < 1) {
    throw std::invalid_argument(fmt::format(
        "BatchSizeFinder: needs a source factory and num_samples >= 1 (got {})", num_samples));
  }
  const auto params = module_->parameters();
  const bool on_cuda = !params.empty() && params.front().is_cuda();
  const int64_t cap = options.max_val() > 0 ? std::min(options.max_val(), num_samples) : num_samples;
  BatchSizeFinderResult result;
  result.mode = options.mode();
  detail::Snapshot snapshot(*module_, optimizer_);
  const auto trial = [&](int64_t size) -> bool {
    snapshot.restore();  // every trial starts from the same state
    result.trials.push_back(run_trial(make_source, size, options));
    return result.trials.back().fits;
  };
  std::optional<int64_t> best;  // the largest size that fit
  try {
    int64_t size = std::min(options.init_val(), cap);
    if (options.memory_budget() > 0 && !on_cuda) {
      // One unmeasured trial first: one-time allocations (thread pools, BLAS buffers) are not the
      // batch size's and would otherwise be charged to the first measured trial.
      snapshot.restore();
      (void)run_trial(make_source, size, BatchSizeFinderOptions(options).memory_budget(0));
    }
    if (options.mode() == "binsearch") {
      // Lightning's _run_binary_scaling: double until a failure, then bisect between the last size that
      // fit (low) and the first that failed (high).
      int64_t low = 1;
      std::optional<int64_t> high;
      int64_t successes = 0;
      while (true) {
        if (trial(size)) {
          best = size;
          if (++successes >= options.max_trials()) {
            break;
          }
          low = size;
          if (high) {
            if (*high - low <= 1) {
              break;
            }
            size = (*high + low) / 2;
          } else {
            const int64_t next = std::min(size * 2, cap);
            if (next == size) {
              break;
            }
            size = next;
          }
        } else {
          high = size;
          if (size == 1) {
            break;
          }
          if (best && *high - low <= 1) {
            break;
          }
          size = best ? (*high + low) / 2 : std::max<int64_t>(1, size / 2);
        }
      }
    } else {
      // Lightning's _run_power_scaling (throughput grows the same way): double while sizes fit; after
      // the first failure stop if something fit, else halve and retry.
      for (int64_t i = 0; i < options.max_trials(); ++i) {
        if (trial(size)) {
          best = size;
          const int64_t next = std::min(size * 2, cap);
          if (next == size) {
            break;
          }
          size = next;
        } else {
          if (best || size == 1) {
            break;
          }
          size /= 2;
        }
      }
    }
  } catch (...) {
    snapshot.restore();
    throw;
  }
  snapshot.restore();
  if (!best) {
    const auto& last = result.trials.back();
    throw std::runtime_error(fmt::format("BatchSizeFinder: no batch size fit (the last tried, {}, failed: {})",
                                         last.batch_size, last.failure));
  }
  result.batch_size = *best;
  if (options.mode() == "throughput") {
    double fastest = -1;
    for (const auto& t : result.trials) {
      if (t.fits && t.samples_per_second > fastest) {
        fastest = t.samples_per_second;
        result.batch_size = t.batch_size;
      }
    }
  }
  return result;
}

}  // namespace trainkit::tune
