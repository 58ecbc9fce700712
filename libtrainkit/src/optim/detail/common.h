#pragma once
// What the optimizers' sources share beyond OptimizerBase: the neutral chunking and kernels of src/detail.

#include <optional>
#include <stdexcept>
#include <vector>

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

/// The trust ratios `ratio(w[i], u[i])` of a foreach step from its two lists of 0-dim norms, `ratio` being
/// elementwise: computed over the stacked norms when they share one dtype and device (a few kernels for the
/// whole list, where pair by pair costs a few per tensor: on a GPU each is a launch), else pair by pair.
/// Elementwise ops give each element the same value either way.
template <class Ratio>
std::vector<at::Tensor> trust_ratios(const std::vector<at::Tensor>& w, const std::vector<at::Tensor>& u,
                                     const Ratio& ratio) {
  bool shared = true;
  for (size_t i = 0; i < w.size() && shared; ++i) {
    shared = w[i].scalar_type() == w[0].scalar_type() && u[i].scalar_type() == w[0].scalar_type() &&
             w[i].device() == w[0].device() && u[i].device() == w[0].device();
  }
  if (shared && w.size() > 1) {
    return ratio(at::stack(w), at::stack(u)).unbind(0);
  }
  std::vector<at::Tensor> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    out[i] = ratio(w[i], u[i]);
  }
  return out;
}

/// How a step's gradients are scaled: multiplied by `inv_scale` (GradScaler's step_scaled), or divided by
/// `grad_scale` with the skip flag `found_inf` left on the device (step_found_inf). Undefined: none.
struct StepScaling {
  at::Tensor inv_scale, grad_scale, found_inf;
};

/// What ATen's fused kernels take of a StepScaling.
struct AtenScaling {
  std::vector<at::Tensor> grads;
  std::optional<at::Tensor> grad_scale, found_inf;
};

/// The gradients, grad_scale and found_inf to hand ATen's fused kernels on `device`: gradients multiplied
/// by `inv_scale` into new tensors where it is defined (the kernels take a scale to divide by).
inline AtenScaling aten_scaling(const std::vector<at::Tensor>& grads, const StepScaling& s, c10::Device device) {
  const auto on_device = [&](const at::Tensor& t) -> std::optional<at::Tensor> {
    if (!t.defined()) {
      return std::nullopt;
    }
    return t.to(at::dtype(at::kFloat).device(device), /*non_blocking=*/true);
  };
  std::vector<at::Tensor> scaled = s.inv_scale.defined() ? at::_foreach_mul(grads, *on_device(s.inv_scale)) : grads;
  return {std::move(scaled), on_device(s.grad_scale), on_device(s.found_inf)};
}

/// Throws std::logic_error when `s` carries a found_inf for the device but param group `group` does not take
/// ATen's fused kernel (only those skip on the device).
inline void check_host_found_inf(const StepScaling& s, const char* optimizer, std::size_t group) {
  if (s.found_inf.defined()) {
    throw std::logic_error(fmt::format(
        "{}: param group {} does not take ATen's fused kernel and cannot skip on a found_inf on the device",
        optimizer, group));
  }
}

}  // namespace trainkit::optim::detail
