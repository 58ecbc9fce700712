#include "trainkit/train/task.h"

#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::train {

LossFn cross_entropy_loss(double label_smoothing) {
  TRAINKIT_CHECK_ARG(label_smoothing >= 0.0 && label_smoothing < 1.0,
                     "cross_entropy_loss: label_smoothing must be in [0, 1), got {}", label_smoothing);
  // label_smoothing = 0 is ATen's plain path (nll_loss of log_softmax).
  return [label_smoothing](const at::Tensor& out, const data::Batch& batch) {
    return torch::nn::functional::cross_entropy(
        out, batch.target(), torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(label_smoothing));
  };
}

LossFn mse_loss() {
  return [](const at::Tensor& out, const data::Batch& batch) {
    const at::Tensor& target = batch.target();
    TRAINKIT_CHECK_ARG(out.numel() == target.numel(), "mse_loss: output {} and target {} differ in size",
                       c10::str(out.sizes()), c10::str(target.sizes()));
    return torch::mse_loss(out, target.reshape(out.sizes()).to(out.scalar_type()));
  };
}

}  // namespace trainkit::train
