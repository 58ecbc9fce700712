#pragma once
/// @file
/// What a training task is to the Trainer and the finders: a forward function over a whole batch and a
/// loss over (output, batch). Any model with any number of inputs and targets fits:
///
///   train::ForwardFn forward = [&](const data::Batch& b) { return model->forward(b.input("tokens"),
///                                                                                b.input("lengths")); };
///   train::LossFn loss = [](const at::Tensor& out, const data::Batch& b) { return mse_loss(out, b.target()); };

#include <functional>

#include <ATen/core/Tensor.h>

#include "trainkit/data/batch.h"

namespace trainkit::train {

/// Maps a batch to the model output.
using ForwardFn = std::function<at::Tensor(const data::Batch& batch)>;
/// Maps (output, batch) to a scalar mean loss.
using LossFn = std::function<at::Tensor(const at::Tensor& output, const data::Batch& batch)>;

/// Cross-entropy between the output (class scores) and target 0 (class indices): the default loss. With
/// `label_smoothing` in (0, 1), against targets mixed with the uniform distribution as
/// torch.nn.CrossEntropyLoss(label_smoothing=...) does: (1 - s) * one-hot + s / classes.
LossFn cross_entropy_loss(double label_smoothing = 0.0);
/// Mean squared error between the output and target 0 (reshaped to the output's shape when the element
/// counts agree, e.g. [B, 1] against [B]).
LossFn mse_loss();

/// Runs `model->forward(batch.input())` for module holders with a one-tensor forward (Sequential, Linear).
template <class Holder>
ForwardFn forward_first_input(Holder model) {
  return [model](const data::Batch& batch) mutable { return model->forward(batch.input()); };
}

}  // namespace trainkit::train
