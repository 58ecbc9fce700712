#include "trainkit/data/tensor_loader.h"

#include <torch/torch.h>

namespace trainkit::data {

TensorLoader::TensorLoader(at::Tensor inputs, at::Tensor targets, TensorLoaderOptions options)
    : inputs_(std::move(inputs)), targets_(std::move(targets)), options_(options) {
  TORCH_CHECK(inputs_.defined() && targets_.defined(), "TensorLoader: inputs and targets must be defined");
  TORCH_CHECK(inputs_.size(0) == targets_.size(0), "TensorLoader: ", inputs_.size(0), " inputs but ",
              targets_.size(0), " targets");
  TORCH_CHECK(options_.batch_size() > 0, "TensorLoader: invalid batch_size: ", options_.batch_size());
  set_epoch(0);
}

void TensorLoader::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  if (options_.shuffle()) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed() + static_cast<uint64_t>(epoch));
    order_ = torch::randperm(inputs_.size(0), gen, torch::TensorOptions().dtype(torch::kInt64));
    if (inputs_.device() != order_.device()) {
      order_ = order_.to(inputs_.device());
    }
  }
}

int64_t TensorLoader::num_batches() const {
  const int64_t n = inputs_.size(0);
  const int64_t b = options_.batch_size();
  return options_.drop_last() ? n / b : (n + b - 1) / b;
}

Batch TensorLoader::batch(int64_t index) const {
  TORCH_CHECK(index >= 0 && index < num_batches(), "TensorLoader: batch ", index, " out of range [0, ",
              num_batches(), ")");
  const int64_t start = index * options_.batch_size();
  const int64_t len = std::min(options_.batch_size(), inputs_.size(0) - start);
  if (!options_.shuffle()) {
    return {inputs_.narrow(0, start, len), targets_.narrow(0, start, len)};
  }
  const at::Tensor idx = order_.narrow(0, start, len);
  return {inputs_.index_select(0, idx), targets_.index_select(0, idx)};
}

}  // namespace trainkit::data
