#include "trainkit/optim/adafactor.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <torch/optim/serialize.h>

#include "optim/detail/common.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

void AdafactorParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq_row);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq_col);
}

void AdafactorParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq_row);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq_col);
}

namespace {

/// timm's choice of the factored dimensions (dim_col, dim_row), or none: dims 0 and 1 of a tensor with more
/// than two dims when both are larger than `min_size` (convolutions), else the last two when both are.
std::optional<std::pair<int64_t, int64_t>> factored_dims(at::IntArrayRef shape, int64_t min_size) {
  const auto ndim = static_cast<int64_t>(shape.size());
  if (ndim > 2 && shape[0] > min_size && shape[1] > min_size) {
    return std::make_pair(int64_t{0}, int64_t{1});
  }
  if (ndim >= 2 && shape[ndim - 2] > min_size && shape[ndim - 1] > min_size) {
    return std::make_pair(ndim - 2, ndim - 1);
  }
  return std::nullopt;
}

/// RMS as timm's _rms: ‖x‖₂ / numel^0.5, a 0-dim tensor.
at::Tensor rms(const at::Tensor& x) { return x.norm(2) / std::pow(static_cast<double>(x.numel()), 0.5); }

/// The step's learning rate (timm's _get_lr): the external lr, or the relative step of parameter `p`.
double step_lr(const AdafactorOptions& o, int64_t step, const at::Tensor& p) {
  if (o.lr().has_value()) {
    return *o.lr();
  }
  const auto t = static_cast<double>(step);
  const double min_step = o.warmup_init() ? 1e-6 * t : 1e-2;
  const double lr_t = std::min(min_step, 1.0 / std::sqrt(t));
  const double param_scale = o.scale_parameter() ? std::max(o.eps_scale(), rms(p).item<double>()) : 1.0;
  return lr_t * param_scale;
}

}  // namespace

bool register_adafactor_optimizer() {
  register_optimizer(OptimizerBinding<Adafactor>("adafactor").entry());
  return true;
}

void Adafactor::update(const at::Tensor& inv_scale) {
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    auto& o = static_cast<AdafactorOptions&>(param_groups_[gi].options());
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor param = params[i];
      if (!param.grad().defined()) {
        continue;
      }
      // Float32 arithmetic and state for bfloat16/float16 parameters, as timm's.
      const auto work = internal::state_dtype(param.scalar_type());
      at::Tensor grad = detail::in_dtype(checked_grad(param, gi, i), work);
      if (inv_scale.defined()) {
        grad = grad * inv_scale.to(grad.device());
      }
      const auto dims = factored_dims(grad.sizes(), o.min_dim_size_to_factor());
      auto& state = state_of(param, [](AdafactorParamState&) {});
      if (o.beta1().has_value() && !state.exp_avg().defined()) {
        state.exp_avg(at::zeros_like(grad));
      }
      if (dims && !state.exp_avg_sq_row().defined()) {
        const auto [dim_col, dim_row] = *dims;
        state.exp_avg_sq_row(at::zeros_like(grad.select(dim_row, 0)));
        state.exp_avg_sq_col(at::zeros_like(grad.select(dim_col, 0)));
      }
      if (!dims && !state.exp_avg_sq().defined()) {
        state.exp_avg_sq(at::zeros_like(grad));
      }
      at::Tensor p = detail::in_dtype(param, work);
      state.step(state.step() + 1);
      const double lr = step_lr(o, state.step(), p);
      if (!o.lr().has_value()) {
        o.set_relative_lr(lr);
      }

      const double beta2t = 1.0 - std::pow(static_cast<double>(state.step()), o.decay_rate());
      at::Tensor update = grad.pow(2) + o.eps();
      if (dims) {
        const auto [dim_col, dim_row] = *dims;
        at::Tensor row = state.exp_avg_sq_row();
        at::Tensor col = state.exp_avg_sq_col();
        row.lerp_(update.mean(dim_row), 1.0 - beta2t);
        col.lerp_(update.mean(dim_col), 1.0 - beta2t);
        // timm's _approx_sq_grad: (row / mean(row))^-1/2 ⊗ col^-1/2.
        const at::Tensor r_factor = (row / row.mean(dim_col, /*keepdim=*/true)).rsqrt_().unsqueeze(dim_row);
        const at::Tensor c_factor = col.unsqueeze(dim_col).rsqrt();
        update = at::mul(r_factor, c_factor);
        update.mul_(grad);
      } else {
        at::Tensor v = state.exp_avg_sq();
        v.lerp_(update, 1.0 - beta2t);
        update = v.rsqrt().mul_(grad);
      }
      update.div_((rms(update) / o.clip_threshold()).clamp_min_(1.0));
      update.mul_(lr);
      if (o.beta1().has_value()) {
        at::Tensor m = state.exp_avg();
        m.lerp_(update, 1 - *o.beta1());
        update = m;
      }
      if (o.weight_decay() != 0) {
        p.add_(p, -o.weight_decay() * lr);
      }
      p.add_(-update);
      detail::write_back(param, p);
    }
  }
}

}  // namespace trainkit::optim
