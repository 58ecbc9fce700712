#pragma once
/// @file
/// Variable-length token sequences in batches: padding with lengths (what
/// `torch::nn::utils::rnn::pack_padded_sequence` takes) and a BatchSource over encoded texts.
///
///   data::SequenceLoader train(ids, labels, data::SequenceLoaderOptions().batch_size(64).pad_index(1));
///   // each batch: input "tokens" int64 [B, T], input "lengths" int64 [B], target 0 int64 [B]

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "trainkit/data/batch_source.h"
#include "trainkit/data/sampler.h"

namespace trainkit::data {

/// A batch of sequences padded to the longest one.
struct PaddedSequences {
  at::Tensor tokens;   ///< int64 [B, T], T = the longest length; positions past a sequence's length hold the pad value
  at::Tensor lengths;  ///< int64 [B], each in [1, T]
};

/// Pads `sequences` (batch-first, like `torch.nn.utils.rnn.pad_sequence(batch_first=True)`) after
/// truncating each to its first `max_len` tokens (0 = no limit). An empty sequence becomes one padding
/// token of length 1, because `pack_padded_sequence` rejects zero lengths. Throws std::invalid_argument
/// for an empty list or a negative max_len.
PaddedSequences pad_sequences(const std::vector<std::vector<int64_t>>& sequences, int64_t padding_value,
                              int64_t max_len = 0);

/// Options of a SequenceLoader: the sampler fields of TensorLoaderOptions (data/sampler.h: sequences per
/// batch, shuffle, seed, shards) and the padding.
struct SequenceLoaderOptions : BasicSamplerOptions<SequenceLoaderOptions> {
  /// The padding value (the vocabulary's `<pad>` index).
  TORCH_ARG(int64_t, pad_index) = 1;
  /// Keep at most the first `max_len` tokens of each sequence (0 = all).
  TORCH_ARG(int64_t, max_len) = 0;
};

/// Batches of encoded texts and their labels: input "tokens" (int64 [B, T], padded per batch to its
/// longest sequence), input "lengths" (int64 [B]) and target 0, the labels (int64 [B]). The order of
/// epoch e depends only on (seed, e): the same permutation, and with num_replicas > 1 the same shard, as a
/// TensorLoader of as many samples.
class SequenceLoader : public BatchSource {
 public:
  /// Throws std::invalid_argument when the counts differ, there is no sequence or an option is invalid.
  SequenceLoader(std::vector<std::vector<int64_t>> sequences, std::vector<int64_t> labels,
                 SequenceLoaderOptions options = {});

  void set_epoch(int64_t epoch) override;
  std::optional<Batch> next() override;
  /// Moves the cursor without padding.
  void skip(int64_t count) override;
  int64_t num_batches() const override;
  /// Batch `index` of the current epoch (random access; the cursor does not move).
  Batch batch(int64_t index) const;
  /// Number of sequences (of all shards).
  int64_t size() const { return static_cast<int64_t>(sequences_.size()); }
  /// The options given at construction.
  const SequenceLoaderOptions& options() const { return options_; }

 private:
  std::vector<std::vector<int64_t>> sequences_;
  std::vector<int64_t> labels_;
  SequenceLoaderOptions options_;
  int64_t cursor_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace trainkit::data
