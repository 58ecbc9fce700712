#include "trainkit/data/tensor_loader.h"

#include <torch/torch.h>

#include "data/detail/epoch_order.h"
#include "detail/check.h"

namespace trainkit::data {

TensorLoader::TensorLoader(at::Tensor inputs, at::Tensor targets, TensorLoaderOptions options)
    : inputs_(std::move(inputs)), targets_(std::move(targets)), options_(options) {
  TRAINKIT_CHECK_ARG(inputs_.defined() && targets_.defined(), "TensorLoader: inputs and targets must be defined");
  TRAINKIT_CHECK_ARG(inputs_.size(0) == targets_.size(0), "TensorLoader: {} inputs but {} targets", inputs_.size(0),
                     targets_.size(0));
  detail::check_sampler(options_, "TensorLoader");
  set_epoch(0);
}

void TensorLoader::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  cursor_ = 0;
  order_ = detail::epoch_order(inputs_.size(0), options_, epoch);
  if (order_.defined() && inputs_.device() != order_.device()) {
    order_ = order_.to(inputs_.device());
  }
}

int64_t TensorLoader::shard_size() const {
  return detail::shard_size(inputs_.size(0), options_);
}

int64_t TensorLoader::num_batches() const {
  return detail::num_batches(shard_size(), options_.batch_size(), options_.drop_last());
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
