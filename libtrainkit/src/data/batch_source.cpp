#include "trainkit/data/batch_source.h"

#include <memory>

#include "detail/check.h"

namespace trainkit::data {

void BatchSource::skip(int64_t count) {
  TRAINKIT_CHECK_ARG(count >= 0, "BatchSource::skip: invalid count: {}", count);
  for (int64_t i = 0; i < count; ++i) {
    if (!next()) {
      return;
    }
  }
}

FunctionSource::FunctionSource(Fn fn, int64_t num_batches)
    : fn_(std::move(fn)), num_batches_(num_batches) {
  TRAINKIT_CHECK_ARG(static_cast<bool>(fn_), "FunctionSource: the function must not be empty");
  TRAINKIT_CHECK_ARG(num_batches_ >= 0 || num_batches_ == kUnknownLength, "FunctionSource: invalid num_batches: {}",
                     num_batches_);
}

void FunctionSource::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  index_ = 0;
}

std::optional<Batch> FunctionSource::next() {
  if (num_batches_ != kUnknownLength && index_ >= num_batches_) {
    return std::nullopt;
  }
  auto batch = fn_(epoch_, index_);
  if (batch) {
    ++index_;
  }
  return batch;
}

void FunctionSource::skip(int64_t count) {
  TRAINKIT_CHECK_ARG(count >= 0, "FunctionSource::skip: invalid count: {}", count);
  index_ += count;
}

FunctionSource from_batches(std::vector<Batch> batches) {
  auto shared = std::make_shared<const std::vector<Batch>>(std::move(batches));
  const auto n = static_cast<int64_t>(shared->size());
  return FunctionSource(
      [shared](int64_t, int64_t index) -> std::optional<Batch> {
        if (index >= static_cast<int64_t>(shared->size())) {
          return std::nullopt;
        }
        return (*shared)[static_cast<size_t>(index)];
      },
      n);
}

}  // namespace trainkit::data
