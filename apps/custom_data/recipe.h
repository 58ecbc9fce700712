#pragma once
// docs/training.md's recipe (the library alone), compiled into custom_data and run by `custom_data --recipe`.

#include <cstdint>

#include <torch/types.h>

/// Trains the recipe's MLP on (x [N, F], y [N, 1]) with the LR finder's valley suggestion and a 1cycle
/// schedule for `epochs` epochs; returns the mean squared error on (val_x, val_y).
double fit_regression(torch::Tensor x, torch::Tensor y, torch::Tensor val_x, torch::Tensor val_y, int64_t epochs);
