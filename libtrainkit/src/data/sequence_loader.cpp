#include "trainkit/data/sequence_loader.h"

#include <algorithm>
#include <numeric>

#include <ATen/ATen.h>

#include "data/detail/epoch_order.h"
#include "detail/check.h"

namespace trainkit::data {

PaddedSequences pad_sequences(const std::vector<std::vector<int64_t>>& sequences, int64_t padding_value,
                              int64_t max_len) {
  TRAINKIT_CHECK_ARG(!sequences.empty(), "pad_sequences: no sequences");
  TRAINKIT_CHECK_ARG(max_len >= 0, "pad_sequences: invalid max_len: {}", max_len);
  const auto batch = static_cast<int64_t>(sequences.size());
  PaddedSequences out;
  out.lengths = at::empty({batch}, at::kLong);
  auto* lengths = out.lengths.data_ptr<int64_t>();
  int64_t longest = 1;
  for (int64_t b = 0; b < batch; ++b) {
    auto n = static_cast<int64_t>(sequences[static_cast<size_t>(b)].size());
    if (max_len > 0) {
      n = std::min(n, max_len);
    }
    lengths[b] = std::max<int64_t>(n, 1);
    longest = std::max(longest, lengths[b]);
  }
  out.tokens = at::full({batch, longest}, padding_value, at::kLong);
  auto* tokens = out.tokens.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const auto& seq = sequences[static_cast<size_t>(b)];
    const auto n = std::min<int64_t>(static_cast<int64_t>(seq.size()), lengths[b]);
    std::copy(seq.begin(), seq.begin() + n, tokens + b * longest);
  }
  return out;
}

SequenceLoader::SequenceLoader(std::vector<std::vector<int64_t>> sequences, std::vector<int64_t> labels,
                               SequenceLoaderOptions options)
    : sequences_(std::move(sequences)), labels_(std::move(labels)), options_(options) {
  TRAINKIT_CHECK_ARG(!sequences_.empty(), "SequenceLoader: no sequences");
  TRAINKIT_CHECK_ARG(sequences_.size() == labels_.size(), "SequenceLoader: {} sequences but {} labels",
                     sequences_.size(), labels_.size());
  detail::check_sampler(options_, "SequenceLoader");
  TRAINKIT_CHECK_ARG(options_.max_len() >= 0, "SequenceLoader: invalid max_len: {}", options_.max_len());
  set_epoch(0);
}

void SequenceLoader::set_epoch(int64_t epoch) {
  cursor_ = 0;
  const at::Tensor order = detail::epoch_order(size(), options_, epoch);
  order_.resize(static_cast<size_t>(detail::shard_size(size(), options_)));
  if (order.defined()) {
    const auto contiguous = order.contiguous();
    std::copy_n(contiguous.data_ptr<int64_t>(), order_.size(), order_.begin());
  } else {
    std::iota(order_.begin(), order_.end(), int64_t{0});
  }
}

int64_t SequenceLoader::num_batches() const {
  return detail::num_batches(static_cast<int64_t>(order_.size()), options_.batch_size(), options_.drop_last());
}

std::optional<Batch> SequenceLoader::next() {
  if (cursor_ >= num_batches()) {
    return std::nullopt;
  }
  return batch(cursor_++);
}

void SequenceLoader::skip(int64_t count) {
  TRAINKIT_CHECK_ARG(count >= 0, "SequenceLoader::skip: invalid count: {}", count);
  cursor_ = std::min(num_batches(), cursor_ + count);
}

Batch SequenceLoader::batch(int64_t index) const {
  TRAINKIT_CHECK_ARG(index >= 0 && index < num_batches(), "SequenceLoader: batch {} out of range [0, {})", index,
                     num_batches());
  const int64_t start = index * options_.batch_size();
  const int64_t len = std::min(options_.batch_size(), static_cast<int64_t>(order_.size()) - start);
  std::vector<std::vector<int64_t>> picked;
  picked.reserve(static_cast<size_t>(len));
  at::Tensor labels = at::empty({len}, at::kLong);
  auto* l = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < len; ++i) {
    const auto sample = static_cast<size_t>(order_[static_cast<size_t>(start + i)]);
    picked.push_back(sequences_[sample]);
    l[i] = labels_[sample];
  }
  PaddedSequences padded = pad_sequences(picked, options_.pad_index(), options_.max_len());
  Batch b;
  b.add_input(std::move(padded.tokens), "tokens");
  b.add_input(std::move(padded.lengths), "lengths");
  b.add_target(std::move(labels), "labels");
  return b;
}

}  // namespace trainkit::data
