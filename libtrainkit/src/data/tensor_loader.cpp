#include "trainkit/data/tensor_loader.h"

#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::data {

TensorLoader::TensorLoader(at::Tensor inputs, at::Tensor targets, TensorLoaderOptions options)
    : inputs_(std::move(inputs)), targets_(std::move(targets)), options_(options) {
  TRAINKIT_CHECK_ARG(inputs_.defined() && targets_.defined(), "TensorLoader: inputs and targets must be defined");
  TRAINKIT_CHECK_ARG(inputs_.size(0) == targets_.size(0), "TensorLoader: {} inputs but {} targets", inputs_.size(0),
                     targets_.size(0));
  TRAINKIT_CHECK_ARG(options_.batch_size() > 0, "TensorLoader: invalid batch_size: {}", options_.batch_size());
  TRAINKIT_CHECK_ARG(options_.num_replicas() >= 1, "TensorLoader: invalid num_replicas: {}", options_.num_replicas());
  TRAINKIT_CHECK_ARG(options_.rank() >= 0 && options_.rank() < options_.num_replicas(),
                     "TensorLoader: rank {} not in [0, num_replicas={})", options_.rank(), options_.num_replicas());
  set_epoch(0);
}

void TensorLoader::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  cursor_ = 0;
  if (options_.shuffle()) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed() + static_cast<uint64_t>(epoch));
    order_ = torch::randperm(inputs_.size(0), gen, torch::TensorOptions().dtype(torch::kInt64));
  }
  const int64_t replicas = options_.num_replicas();
  if (replicas > 1) {
    // DistributedSampler: pad to a multiple of num_replicas by wrapping around, then stride by rank.
    const int64_t n = inputs_.size(0);
    at::Tensor order = options_.shuffle() ? order_ : torch::arange(n, torch::TensorOptions().dtype(torch::kInt64));
    const int64_t total = shard_size() * replicas;
    while (order.size(0) < total) {
      order = torch::cat({order, order.narrow(0, 0, std::min(order.size(0), total - order.size(0)))});
    }
    order_ = order.narrow(0, options_.rank(), shard_size() * replicas - options_.rank())
                 .slice(0, 0, c10::nullopt, replicas)
                 .contiguous();
  }
  if (order_.defined() && inputs_.device() != order_.device()) {
    order_ = order_.to(inputs_.device());
  }
}

int64_t TensorLoader::shard_size() const {
  const int64_t replicas = options_.num_replicas();
  return (inputs_.size(0) + replicas - 1) / replicas;
}

int64_t TensorLoader::num_batches() const {
  const int64_t n = shard_size();
  const int64_t b = options_.batch_size();
  return options_.drop_last() ? n / b : (n + b - 1) / b;
}

std::optional<Batch> TensorLoader::next() {
  if (cursor_ >= num_batches()) {
    return std::nullopt;
  }
  return batch(cursor_++);
}

void TensorLoader::skip(int64_t count) {
  TRAINKIT_CHECK_ARG(count >= 0, "TensorLoader::skip: invalid count: {}", count);
  cursor_ = std::min(num_batches(), cursor_ + count);
}

Batch TensorLoader::batch(int64_t index) const {
  TRAINKIT_CHECK_ARG(index >= 0 && index < num_batches(), "TensorLoader: batch {} out of range [0, {})", index,
                     num_batches());
  const int64_t start = index * options_.batch_size();
  const int64_t len = std::min(options_.batch_size(), shard_size() - start);
  if (!order_.defined()) {
    return Batch(inputs_.narrow(0, start, len), targets_.narrow(0, start, len));
  }
  const at::Tensor idx = order_.narrow(0, start, len);
  return Batch(inputs_.index_select(0, idx), targets_.index_select(0, idx));
}

}  // namespace trainkit::data
