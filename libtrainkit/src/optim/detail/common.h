#pragma once
// What the optimizers' sources share beyond OptimizerBase: the neutral chunking and kernels of src/detail,
// and the check of one option value.

#include <stdexcept>

#include <torch/torch.h>

#include "detail/check.h"
#include "detail/parallel.h"
#include "trainkit/optim/optimizer_base.h"

namespace trainkit::optim::detail {

using namespace trainkit::detail;  // NOLINT(google-build-using-namespace): chunks and kernels, one layer down

/// The factory's description of every optimizer's `fused` argument.
constexpr const char* kFusedDoc =
    "true: the fused CPU kernel (or an error); false: the ATen reference path; unset: fused where possible";

/// Checks a value of an option; throws std::invalid_argument naming the optimizer, option and value.
inline void check_option(bool ok, const char* optimizer, const char* what, double value) {
  TRAINKIT_CHECK_ARG(ok, "{}: invalid {}: {}", optimizer, what, value);
}

}  // namespace trainkit::optim::detail
