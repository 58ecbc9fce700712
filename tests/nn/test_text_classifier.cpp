// Text classifiers: the LSTM classifier's packed path (pack_padded_sequence, enforce_sorted = false, any
// order of lengths) gives the same logits, loss and gradients as running every sequence alone and unpadded
// through the same embedding, LSTM and head (float64); the bag-of-words model is the mean of its tokens'
// weight rows.
#include <cmath>
#include <vector>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/data/sequence_loader.h"
#include "trainkit/nn/text_classifier.h"

using namespace trainkit;

namespace {

/// The logits of one unpadded sequence [T] through the classifier's own layers, without packing.
at::Tensor run_alone(nn::LstmClassifierImpl& model, const at::Tensor& sequence) {
  const at::Tensor embedded = model.embedding(sequence.unsqueeze(0));  // [1, T, E]
  const auto out = model.lstm->forward(embedded);
  const at::Tensor& h_n = std::get<0>(std::get<1>(out));  // [layers × directions, 1, H]
  const at::Tensor features =
      model.options().bidirectional() ? torch::cat({h_n[-2], h_n[-1]}, 1) : h_n[-1];
  return model.head(features);
}

}  // namespace

TEST_CASE("LstmClassifier: the packed batch gives the loss of each sequence run alone", "[text][nn][lstm]") {
  const bool bidirectional = GENERATE(false, true);
  const int64_t layers = GENERATE(1, 2);
  INFO("bidirectional " << bidirectional << ", layers " << layers);
  torch::manual_seed(11);
  nn::LstmClassifier model(nn::LstmClassifierOptions(30, 4)
                               .embedding_dim(6)
                               .hidden_size(5)
                               .num_layers(layers)
                               .bidirectional(bidirectional)
                               .dropout(0.3)
                               .padding_idx(1));
  model->to(torch::kFloat64);
  model->eval();  // dropout off: both paths must see the same network

  // Unsorted lengths, one of length 1, padding that differs per row.
  const std::vector<std::vector<int64_t>> sequences = {
      {4, 9, 2}, {7, 3, 3, 8, 12, 5, 6}, {20}, {2, 5, 29, 17, 11}, {13, 13}};
  const at::Tensor labels = torch::tensor({1, 3, 0, 2, 1}, torch::kLong);
  const auto padded = data::pad_sequences(sequences, 1);

  const at::Tensor logits = model->forward(padded.tokens, padded.lengths);
  REQUIRE(logits.sizes() == at::IntArrayRef({5, 4}));
  const at::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
  loss.backward();
  std::vector<at::Tensor> packed_grads;
  for (const auto& p : model->parameters()) {
    packed_grads.push_back(p.grad().clone());
  }
  model->zero_grad(/*set_to_none=*/true);

  std::vector<at::Tensor> alone;
  for (const auto& seq : sequences) {
    alone.push_back(run_alone(*model, torch::tensor(seq, torch::kLong)));
  }
  const at::Tensor alone_logits = torch::cat(alone, 0);
  const at::Tensor alone_loss = torch::nn::functional::cross_entropy(alone_logits, labels);
  alone_loss.backward();

  CHECK(torch::allclose(logits, alone_logits, 1e-12, 1e-12));
  CHECK(std::abs(loss.item<double>() - alone_loss.item<double>()) < 1e-12);
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(torch::allclose(packed_grads[i], params[i].grad(), 1e-10, 1e-12));
  }
  // Padding never matters: other values in the padded positions give the same logits.
  const at::Tensor noisy = padded.tokens.clone();
  noisy.masked_fill_(noisy.eq(1), 23);
  CHECK(torch::allclose(model->forward(noisy, padded.lengths), logits, 1e-12, 1e-12));
}

TEST_CASE("LstmClassifier rejects invalid options with the value", "[text][nn][lstm]") {
  CHECK_THROWS_MATCHES(nn::LstmClassifier(nn::LstmClassifierOptions(10, 2).dropout(1.0)), std::invalid_argument,
                       test::WhatContains("invalid dropout: 1"));
  CHECK_THROWS_MATCHES(nn::LstmClassifier(nn::LstmClassifierOptions(10, 2).padding_idx(10)), std::invalid_argument,
                       test::WhatContains("padding_idx 10"));
}

TEST_CASE("BagOfWordsClassifier is logistic regression on token frequencies", "[text][nn]") {
  nn::BagOfWordsClassifier model(nn::BagOfWordsClassifierOptions(6, 3).padding_idx(1));
  {
    torch::NoGradGuard no_grad;
    model->weight->weight.copy_(torch::arange(18, torch::kFloat32).view({6, 3}));
    model->weight->weight[1].zero_();
    model->bias.copy_(torch::tensor({0.5f, -1.0f, 2.0f}));
  }
  const auto padded = data::pad_sequences({{2, 3, 2}, {5}}, 1);
  const at::Tensor logits = model->forward(padded.tokens, padded.lengths);
  // Frequencies x: row 0 has token 2 twice and 3 once of 3 tokens; row 1 has token 5 once.
  at::Tensor x = torch::zeros({2, 6});
  x[0][2] = 2.0 / 3.0;
  x[0][3] = 1.0 / 3.0;
  x[1][5] = 1.0;
  const at::Tensor expected = x.matmul(model->weight->weight) + model->bias;
  CHECK(torch::allclose(logits, expected, 1e-6, 1e-6));
}
