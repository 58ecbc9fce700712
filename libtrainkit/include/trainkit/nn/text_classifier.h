#pragma once
/// @file
/// Text classifiers over padded token ids with lengths (data::SequenceLoader's "tokens" and "lengths"):
/// an embedding + LSTM + linear classifier that runs the LSTM on `pack_padded_sequence` so padding never
/// enters the recurrence, and a bag-of-words logistic regression baseline.
///
///   nn::LstmClassifier model(nn::LstmClassifierOptions(vocab.size(), 2).bidirectional(true));
///   at::Tensor logits = model->forward(batch.input("tokens"), batch.input("lengths"));

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/rnn.h>
#include <torch/nn/pimpl.h>

namespace trainkit::nn {

/// Options of an LstmClassifier.
struct LstmClassifierOptions {
  LstmClassifierOptions(int64_t vocab_size, int64_t num_classes)
      : vocab_size_(vocab_size), num_classes_(num_classes) {}
  /// Rows of the embedding (the vocabulary's size).
  TORCH_ARG(int64_t, vocab_size);
  /// Outputs (classes).
  TORCH_ARG(int64_t, num_classes);
  /// Width of a token's embedding.
  TORCH_ARG(int64_t, embedding_dim) = 64;
  /// LSTM hidden size (per direction).
  TORCH_ARG(int64_t, hidden_size) = 64;
  /// Stacked LSTM layers.
  TORCH_ARG(int64_t, num_layers) = 1;
  /// Run a second LSTM right to left and concatenate both final states.
  TORCH_ARG(bool, bidirectional) = false;
  /// Dropout on the embeddings, between LSTM layers and before the linear head.
  TORCH_ARG(double, dropout) = 0.0;
  /// The padding token's id: its embedding row is zero and gets no gradient.
  TORCH_ARG(int64_t, padding_idx) = 1;
};

/// Embedding → LSTM (on the packed batch) → final hidden state of the last layer (both directions'
/// concatenated when bidirectional) → dropout → linear. Returns logits [B, num_classes].
class LstmClassifierImpl : public torch::nn::Module {
 public:
  explicit LstmClassifierImpl(const LstmClassifierOptions& options);
  /// `tokens` int64 [B, T] padded ids; `lengths` int64 [B] in [1, T] (any order: the batch is packed with
  /// enforce_sorted = false and the LSTM's final states come back in the batch's order).
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& lengths);
  /// The features the head sees: the last layer's final hidden state(s), [B, hidden_size × directions].
  at::Tensor features(const at::Tensor& tokens, const at::Tensor& lengths);
  /// Throws std::invalid_argument (echoing the value) for a non-positive size, a dropout outside
  /// [0, 1) or a padding_idx outside [0, vocab_size).
  static void validate(const LstmClassifierOptions& options);

  const LstmClassifierOptions& options() const { return options_; }

  torch::nn::Embedding embedding{nullptr};
  torch::nn::LSTM lstm{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  LstmClassifierOptions options_;
};
TORCH_MODULE(LstmClassifier);

/// Options of a BagOfWordsClassifier.
struct BagOfWordsClassifierOptions {
  BagOfWordsClassifierOptions(int64_t vocab_size, int64_t num_classes)
      : vocab_size_(vocab_size), num_classes_(num_classes) {}
  /// Vocabulary size (features).
  TORCH_ARG(int64_t, vocab_size);
  /// Outputs (classes).
  TORCH_ARG(int64_t, num_classes);
  /// The padding token's id: it is not a feature.
  TORCH_ARG(int64_t, padding_idx) = 1;
};

/// Multinomial logistic regression on a text's bag of words: logits = W·x + b where x is the vector of
/// token frequencies (counts / length, the padding left out), computed as the mean of the tokens' rows
/// of W (an embedding of width num_classes), without building x. Starts from W = 0, b = 0.
class BagOfWordsClassifierImpl : public torch::nn::Module {
 public:
  explicit BagOfWordsClassifierImpl(const BagOfWordsClassifierOptions& options);
  /// `tokens` int64 [B, T] padded ids. Returns logits [B, num_classes]. `lengths` is taken for the same
  /// call as LstmClassifier's; the counts come from the tokens that are not padding.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& lengths);

  torch::nn::Embedding weight{nullptr};
  at::Tensor bias;

 private:
  BagOfWordsClassifierOptions options_;
};
TORCH_MODULE(BagOfWordsClassifier);

}  // namespace trainkit::nn
