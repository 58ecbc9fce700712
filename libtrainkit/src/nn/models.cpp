#include "trainkit/nn/models.h"

#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::nn {

torch::nn::Sequential make_cnn(const CnnOptions& options) {
  TRAINKIT_CHECK_ARG(!options.channels().empty(), "make_cnn: channels must not be empty");
  TRAINKIT_CHECK_ARG(options.dropout() >= 0.0 && options.dropout() < 1.0, "make_cnn: invalid dropout: {}",
                     options.dropout());
  torch::nn::Sequential net;
  int64_t in = options.in_channels();
  int64_t size = options.image_size();
  for (const int64_t out : options.channels()) {
    TRAINKIT_CHECK_ARG(out > 0, "make_cnn: invalid channel count: {}", out);
    TRAINKIT_CHECK_ARG(size >= 2, "make_cnn: too many conv blocks for image size {}", options.image_size());
    net->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(!options.batch_norm())));
    if (options.batch_norm()) {
      net->push_back(torch::nn::BatchNorm2d(out));
    }
    // Pooling before the ReLU: max and ReLU commute (values and gradients alike), and the ReLU then touches
    // a quarter of the elements.
    net->push_back(torch::nn::MaxPool2d(2));
    net->push_back(torch::nn::ReLU());
    in = out;
    size /= 2;
  }
  net->push_back(torch::nn::Flatten());
  if (options.dropout() > 0) {
    net->push_back(torch::nn::Dropout(options.dropout()));
  }
  net->push_back(torch::nn::Linear(in * size * size, options.hidden()));
  net->push_back(torch::nn::ReLU());
  if (options.dropout() > 0) {
    net->push_back(torch::nn::Dropout(options.dropout()));
  }
  net->push_back(torch::nn::Linear(options.hidden(), options.num_classes()));
  return net;
}

torch::nn::Sequential make_mlp(const MlpOptions& options) {
  torch::nn::Sequential net;
  net->push_back(torch::nn::Flatten());
  int64_t in = options.in_features();
  for (const int64_t width : options.hidden()) {
    TRAINKIT_CHECK_ARG(width > 0, "make_mlp: invalid hidden width: {}", width);
    net->push_back(torch::nn::Linear(in, width));
    net->push_back(torch::nn::ReLU());
    if (options.dropout() > 0) {
      net->push_back(torch::nn::Dropout(options.dropout()));
    }
    in = width;
  }
  net->push_back(torch::nn::Linear(in, options.num_classes()));
  return net;
}

}  // namespace trainkit::nn
