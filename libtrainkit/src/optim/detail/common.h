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

/// The kernels' view of a parameter element type P: `storage` (what the kernel's pointers point to) and
/// `math` (the type the kernel computes in and keeps state in): float for bfloat16 and float16.
template <class P>
struct KernelTypes {
  using storage = P;
  using math = P;
};
template <>
struct KernelTypes<c10::BFloat16> {
  using storage = BFloat16Bits;
  using math = float;
};
template <>
struct KernelTypes<c10::Half> {
  using storage = HalfBits;
  using math = float;
};

/// The data of a contiguous tensor of element type P as the kernels' storage type, at element `offset`.
template <class P>
typename KernelTypes<P>::storage* kernel_data(const at::Tensor& t, int64_t offset) {
  return reinterpret_cast<typename KernelTypes<P>::storage*>(t.data_ptr<P>()) + offset;
}

/// A parameter `p` computed in `work` (its state's dtype): `p` itself, or a copy that write_back() stores.
inline at::Tensor in_dtype(const at::Tensor& p, at::ScalarType work) {
  return p.scalar_type() == work ? p : p.to(work);
}
/// Stores `worked` (from in_dtype) into `p` unless it is `p`.
inline void write_back(at::Tensor& p, const at::Tensor& worked) {
  if (!worked.is_same(p)) {
    p.copy_(worked);
  }
}

/// The factory's description of every optimizer's `fused` argument.
constexpr const char* kFusedDoc =
    "true: the fused CPU kernel (or an error); false: the ATen reference path; unset: fused where possible";

/// The factory's description of every optimizer's `foreach` argument.
constexpr const char* kForeachDoc =
    "true: the multi-tensor ATen path (_foreach_* ops; not with fused = true); unset: on for tensors off the CPU "
    "(CUDA)";

/// Checks a value of an option; throws std::invalid_argument naming the optimizer, option and value.
inline void check_option(bool ok, const char* optimizer, const char* what, double value) {
  TRAINKIT_CHECK_ARG(ok, "{}: invalid {}: {}", optimizer, what, value);
}

}  // namespace trainkit::optim::detail
