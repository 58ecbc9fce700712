#include "trainkit/nn/text_classifier.h"

#include <torch/nn/utils/rnn.h>
#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::nn {

void LstmClassifierImpl::validate(const LstmClassifierOptions& o) {
  TRAINKIT_CHECK_ARG(o.vocab_size() > 0, "LstmClassifier: invalid vocab_size: {}", o.vocab_size());
  TRAINKIT_CHECK_ARG(o.num_classes() > 0, "LstmClassifier: invalid num_classes: {}", o.num_classes());
  TRAINKIT_CHECK_ARG(o.embedding_dim() > 0, "LstmClassifier: invalid embedding_dim: {}", o.embedding_dim());
  TRAINKIT_CHECK_ARG(o.hidden_size() > 0, "LstmClassifier: invalid hidden_size: {}", o.hidden_size());
  TRAINKIT_CHECK_ARG(o.num_layers() > 0, "LstmClassifier: invalid num_layers: {}", o.num_layers());
  TRAINKIT_CHECK_ARG(o.dropout() >= 0.0 && o.dropout() < 1.0, "LstmClassifier: invalid dropout: {}", o.dropout());
  TRAINKIT_CHECK_ARG(o.padding_idx() >= 0 && o.padding_idx() < o.vocab_size(),
                     "LstmClassifier: padding_idx {} is outside [0, vocab_size={})", o.padding_idx(), o.vocab_size());
}

LstmClassifierImpl::LstmClassifierImpl(const LstmClassifierOptions& options) : options_(options) {
  validate(options_);
  embedding = register_module(
      "embedding", torch::nn::Embedding(torch::nn::EmbeddingOptions(options_.vocab_size(), options_.embedding_dim())
                                            .padding_idx(options_.padding_idx())));
  lstm = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(options_.embedding_dim(), options_.hidden_size())
                                                     .num_layers(options_.num_layers())
                                                     .bidirectional(options_.bidirectional())
                                                     .dropout(options_.num_layers() > 1 ? options_.dropout() : 0.0)
                                                     .batch_first(true)));
  dropout = register_module("dropout", torch::nn::Dropout(options_.dropout()));
  const int64_t directions = options_.bidirectional() ? 2 : 1;
  head = register_module("head", torch::nn::Linear(options_.hidden_size() * directions, options_.num_classes()));
}

at::Tensor LstmClassifierImpl::features(const at::Tensor& tokens, const at::Tensor& lengths) {
  TRAINKIT_CHECK_ARG(tokens.dim() == 2, "LstmClassifier: tokens must be [batch, time], got {} dimensions", tokens.dim());
  TRAINKIT_CHECK_ARG(lengths.dim() == 1 && lengths.size(0) == tokens.size(0),
                     "LstmClassifier: lengths must be [batch] = [{}], got {} dimensions of size {}", tokens.size(0),
                     lengths.dim(), lengths.dim() > 0 ? lengths.size(0) : 0);
  const at::Tensor embedded = dropout(embedding(tokens));
  // pack_padded_sequence wants the lengths on the CPU.
  const auto packed = torch::nn::utils::rnn::pack_padded_sequence(embedded, lengths.to(at::kCPU, at::kLong),
                                                                  /*batch_first=*/true, /*enforce_sorted=*/false);
  const auto result = lstm->forward_with_packed_input(packed);
  const at::Tensor& h_n = std::get<0>(std::get<1>(result));  // [layers × directions, B, H], batch order restored
  if (options_.bidirectional()) {
    return torch::cat({h_n[-2], h_n[-1]}, 1);
  }
  return h_n[-1];
}

at::Tensor LstmClassifierImpl::forward(const at::Tensor& tokens, const at::Tensor& lengths) {
  return head(dropout(features(tokens, lengths)));
}

BagOfWordsClassifierImpl::BagOfWordsClassifierImpl(const BagOfWordsClassifierOptions& options) : options_(options) {
  TRAINKIT_CHECK_ARG(options_.vocab_size() > 0, "BagOfWordsClassifier: invalid vocab_size: {}", options_.vocab_size());
  TRAINKIT_CHECK_ARG(options_.num_classes() > 0, "BagOfWordsClassifier: invalid num_classes: {}",
                     options_.num_classes());
  TRAINKIT_CHECK_ARG(options_.padding_idx() >= 0 && options_.padding_idx() < options_.vocab_size(),
                     "BagOfWordsClassifier: padding_idx {} is outside [0, vocab_size={})", options_.padding_idx(),
                     options_.vocab_size());
  weight = register_module("weight", torch::nn::Embedding(torch::nn::EmbeddingOptions(options_.vocab_size(),
                                                                                      options_.num_classes())
                                                              .padding_idx(options_.padding_idx())));
  {
    torch::NoGradGuard no_grad;
    weight->weight.zero_();
  }
  bias = register_parameter("bias", torch::zeros({options_.num_classes()}));
}

at::Tensor BagOfWordsClassifierImpl::forward(const at::Tensor& tokens, const at::Tensor& /*lengths*/) {
  // Padding rows are zero, so the sum over time counts only the text's own tokens.
  const at::Tensor counts = (tokens != options_.padding_idx()).sum(1, /*keepdim=*/true).clamp_min(1);
  return weight(tokens).sum(1) / counts.to(weight->weight.scalar_type()) + bias;
}

}  // namespace trainkit::nn
