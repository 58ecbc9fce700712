#include "trainkit/data/parallel_loader.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "data/detail/epoch_order.h"
#include "detail/check.h"

namespace trainkit::data {

ParallelLoader::ParallelLoader(int64_t size, SampleFn sample, ParallelLoaderOptions options, CollateFn collate)
    : size_(size), sample_(std::move(sample)), collate_(std::move(collate)), options_(options) {
  TRAINKIT_CHECK_ARG(size_ > 0, "ParallelLoader: the data set is empty (size {})", size_);
  TRAINKIT_CHECK_ARG(static_cast<bool>(sample_), "ParallelLoader: no sample function");
  TRAINKIT_CHECK_ARG(static_cast<bool>(collate_), "ParallelLoader: no collate function");
  detail::check_sampler(options_, "ParallelLoader");
  TRAINKIT_CHECK_ARG(options_.num_workers() >= 0, "ParallelLoader: invalid num_workers: {}", options_.num_workers());
  TRAINKIT_CHECK_ARG(options_.prefetch_factor() >= 1, "ParallelLoader: invalid prefetch_factor: {}",
                     options_.prefetch_factor());
  TRAINKIT_CHECK_ARG(!options_.pin_memory() || torch::cuda::is_available(),
                     "ParallelLoader: pin_memory needs a CUDA device and none is available");
  num_batches_ = detail::num_batches(detail::shard_size(size_, options_), options_.batch_size(), options_.drop_last());
  set_epoch(0);
  if (options_.num_workers() == 0) {
    return;
  }
  // Workers get one intra-op thread each. at::set_num_threads sets the calling thread's OpenMP team size
  // but also a process-wide default that threads read when they first run a parallel op: initialize this
  // thread before the workers touch the default, and put the default back once every worker has set its
  // own (the window in between only matters to a third thread starting its first parallel op then).
  const int caller_threads = at::get_num_threads();
  int64_t started = 0;
  std::condition_variable started_cv;
  workers_.reserve(static_cast<size_t>(options_.num_workers()));
  for (int64_t w = 0; w < options_.num_workers(); ++w) {
    workers_.emplace_back([this, &started, &started_cv] {
      at::get_num_threads();  // the thread's lazy initialization first, or it would undo the next line
      at::set_num_threads(1);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++started;
      }
      started_cv.notify_all();
      worker_loop();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    started_cv.wait(lock, [&] { return started == options_.num_workers(); });
  }
  at::set_num_threads(caller_threads);
}

ParallelLoader::~ParallelLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) {
    w.join();
  }
}

void ParallelLoader::set_epoch(int64_t epoch) {
  const at::Tensor order = detail::epoch_order(size_, options_, epoch);
  std::vector<int64_t> indices(static_cast<size_t>(detail::shard_size(size_, options_)));
  if (order.defined()) {
    std::copy_n(order.data_ptr<int64_t>(), indices.size(), indices.begin());
  } else {
    std::iota(indices.begin(), indices.end(), int64_t{0});
  }
  std::map<int64_t, Slot> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++generation_;
    epoch_ = epoch;
    order_ = std::move(indices);
    cursor_ = 0;
    dispatched_ = 0;
    active_ = false;
    dropped.swap(ready_);
  }
}

void ParallelLoader::skip(int64_t count) {
  TRAINKIT_CHECK_ARG(count >= 0, "ParallelLoader::skip: invalid count: {}", count);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cursor_ = std::min(num_batches_, cursor_ + count);
    ready_.erase(ready_.begin(), ready_.lower_bound(cursor_));
    dispatched_ = std::max(dispatched_, cursor_);
  }
  work_cv_.notify_all();
}

std::optional<Batch> ParallelLoader::next() {
  const int64_t index = cursor_;  // only this thread writes cursor_
  if (index >= num_batches_) {
    return std::nullopt;
  }
  Slot slot;
  if (workers_.empty()) {
    slot = load(epoch_, indices_of(index), [] { return false; });
    ++cursor_;
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!active_) {
      active_ = true;
      work_cv_.notify_all();
    }
    ready_cv_.wait(lock, [&] { return ready_.count(index) > 0; });
    auto it = ready_.find(index);
    slot = std::move(it->second);
    ready_.erase(it);
    ++cursor_;  // frees a place in the prefetch window
    lock.unlock();
    work_cv_.notify_one();
  }
  if (slot.error) {
    rethrow(slot, index);
  }
  return std::move(slot.batch);
}

bool ParallelLoader::can_dispatch() const {
  return active_ && dispatched_ < num_batches_ &&
         dispatched_ < cursor_ + options_.num_workers() * options_.prefetch_factor();
}

std::vector<int64_t> ParallelLoader::indices_of(int64_t index) const {
  const int64_t start = index * options_.batch_size();
  const int64_t len = std::min(options_.batch_size(), static_cast<int64_t>(order_.size()) - start);
  return {order_.begin() + start, order_.begin() + start + len};
}

void ParallelLoader::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || can_dispatch(); });
    if (stop_) {
      return;
    }
    const int64_t index = dispatched_++;
    const uint64_t generation = generation_;
    const int64_t epoch = epoch_;
    const std::vector<int64_t> indices = indices_of(index);
    lock.unlock();
    const auto cancelled = [&] {
      std::lock_guard<std::mutex> guard(mutex_);
      return stop_ || generation != generation_ || index < cursor_;
    };
    Slot slot = load(epoch, indices, cancelled);
    lock.lock();
    if (generation == generation_ && index >= cursor_ && !stop_) {
      ready_.emplace(index, std::move(slot));
      ready_cv_.notify_all();
    }
  }
}

ParallelLoader::Slot ParallelLoader::load(int64_t epoch, const std::vector<int64_t>& indices,
                                          const std::function<bool()>& cancelled) const {
  torch::NoGradGuard no_grad;
  Slot slot;
  std::vector<Batch> samples;
  samples.reserve(indices.size());
  int64_t current = -1;
  try {
    for (const int64_t i : indices) {
      if (cancelled()) {
        return slot;
      }
      current = i;
      const uint64_t seed = detail::derive_seed(options_.seed(), detail::SeedStream::kSample, epoch, i);
      at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
      samples.push_back(sample_(i, generator));
    }
    current = -1;
    slot.batch = collate_(samples);
    if (options_.pin_memory()) {
      slot.where = "pin_memory";
      slot.batch = slot.batch.pin_memory();
    }
  } catch (...) {
    slot.error = std::current_exception();
    if (current >= 0) {
      slot.where = fmt::format("sample {}", current);
    } else if (slot.where.empty()) {
      slot.where = "collate";
    }
  }
  return slot;
}

void ParallelLoader::rethrow(const Slot& slot, int64_t index) const {
  const std::string prefix = fmt::format("ParallelLoader: epoch {}, batch {} ({}): ", epoch_, index, slot.where);
  try {
    std::rethrow_exception(slot.error);
  } catch (const std::exception& e) {
    std::throw_with_nested(std::runtime_error(prefix + e.what()));
  } catch (...) {
    std::throw_with_nested(std::runtime_error(prefix + "unknown exception"));
  }
}

}  // namespace trainkit::data
