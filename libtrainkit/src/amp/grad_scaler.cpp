#include "trainkit/amp/grad_scaler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iterator>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include "detail/parallel.h"
#include "trainkit/optim/scaled_step.h"

namespace trainkit::amp {
namespace {

constexpr int64_t kStateVersion = 1;

/// Checks `options` against their binding: "<where>: <key>: expected <what>, got <value>".
void check(const GradScalerOptions& options, const std::string& where = "GradScaler") {
  check_options(GradScalerOptions::binding(), options, where);
}

/// A copy of `t` on `device` (Python's _MultiDeviceReplicator serves one per device).
at::Tensor copy_to(const at::Tensor& t, c10::Device device) {
  return t.to(t.options().device(device), /*non_blocking=*/true, /*copy=*/true);
}

/// The gradients of `opt` when the fused CPU check can take them all (contiguous float32/float64 on the
/// CPU, one dtype), else nothing.
std::optional<std::vector<at::Tensor>> fused_checkable_grads(const torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> grads;
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.grad().defined()) {
        if (p.grad().layout() != at::kStrided) {
          return std::nullopt;
        }
        grads.push_back(p.grad());
      }
    }
  }
  if (grads.empty() || !detail::fusable(grads, nullptr)) {
    return std::nullopt;
  }
  return grads;
}

/// Whether any gradient holds an inf or NaN: one read-only pass, each thread over one contiguous range.
bool any_nonfinite(const std::vector<at::Tensor>& grads) {
  const bool f32 = grads.front().scalar_type() == at::kFloat;
  std::atomic<bool> found{false};
  detail::for_each_even(detail::numels_of(grads), [&](const detail::Chunk& c) {
    const auto t = static_cast<size_t>(c.tensor);
    const double probe = f32 ? detail::nonfinite_probe(grads[t].data_ptr<float>() + c.begin, c.n)
                             : detail::nonfinite_probe(grads[t].data_ptr<double>() + c.begin, c.n);
    if (probe != 0.0) {
      found.store(true, std::memory_order_relaxed);
    }
  });
  return found.load();
}

/// The found-inf flags of every device summed on `device` (no host read). Throws std::logic_error when no
/// inf check was recorded.
at::Tensor summed_found_inf(const std::vector<std::pair<c10::Device, at::Tensor>>& per_device,
                            const c10::Device& device) {
  if (per_device.empty()) {
    throw std::logic_error("GradScaler: no inf checks were recorded for this optimizer (no parameter has a gradient)");
  }
  at::Tensor found = per_device.front().second.to(device, /*non_blocking=*/true);
  for (size_t i = 1; i < per_device.size(); ++i) {
    found = found + per_device[i].second.to(device, /*non_blocking=*/true);
  }
  return found;
}

}  // namespace

GradScaler::GradScaler(c10::Device device, GradScalerOptions options)
    : device_(device),
      enabled_(options.enabled()),
      init_scale_(options.init_scale()),
      growth_factor_(options.growth_factor()),
      backoff_factor_(options.backoff_factor()),
      growth_interval_(options.growth_interval()) {
  check(options);
  if (enabled_ && device_.is_cuda() && !torch::cuda::is_available()) {
    TORCH_WARN("GradScaler is enabled on ", device_, ", but CUDA is not available. Disabling.");
    enabled_ = false;
  }
}

void GradScaler::check_scale_initialized(const char* funcname) const {
  if (!scale_.defined()) {
    throw std::logic_error(fmt::format(
        "GradScaler: {}() called before any scale(); scale the loss (scaler.scale(loss).backward()) earlier in "
        "the iteration",
        funcname));
  }
}

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!enabled_) {
    return loss;
  }
  if (!scale_.defined()) {
    scale_ = at::full({}, init_scale_, at::TensorOptions().dtype(at::kFloat).device(device_));
    growth_tracker_ = at::full({}, init_growth_tracker_, at::TensorOptions().dtype(at::kInt).device(device_));
  }
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

std::vector<at::Tensor> GradScaler::scale(const std::vector<at::Tensor>& outputs) {
  std::vector<at::Tensor> out;
  out.reserve(outputs.size());
  for (const auto& t : outputs) {
    out.push_back(scale(t));
  }
  return out;
}

std::vector<std::pair<c10::Device, at::Tensor>> GradScaler::unscale_grads(torch::optim::Optimizer& opt,
                                                                          const at::Tensor& inv_scale,
                                                                          const at::Tensor& found_inf) {
  struct Bucket {
    c10::Device device;
    c10::ScalarType dtype;
    std::vector<at::Tensor> grads;
  };
  std::vector<Bucket> buckets;  // one per (device, dtype), in first-seen order
  at::NoGradGuard no_grad;
  for (const auto& group : opt.param_groups()) {
    for (const auto& param : group.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) {
        continue;
      }
      if (grad.layout() != at::kStrided) {
        throw std::invalid_argument(
            fmt::format("GradScaler: sparse gradients are unsupported (a parameter of shape {} has a {} gradient)",
                        c10::str(param.sizes()), c10::str(grad.layout())));
      }
      if (grad.scalar_type() == at::kHalf) {
        throw std::invalid_argument(
            "GradScaler: attempting to unscale float16 gradients; keep the parameters in float32 and let "
            "autocast run the ops in float16");
      }
      auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
        return b.device == grad.device() && b.dtype == grad.scalar_type();
      });
      if (it == buckets.end()) {
        buckets.push_back(Bucket{grad.device(), grad.scalar_type(), {}});
        it = std::prev(buckets.end());
      }
      it->grads.push_back(grad);
    }
  }

  std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device;
  std::vector<at::Tensor> inv_scale_per_device;
  for (auto& bucket : buckets) {
    size_t d = 0;
    while (d < found_inf_per_device.size() && found_inf_per_device[d].first != bucket.device) {
      ++d;
    }
    if (d == found_inf_per_device.size()) {
      found_inf_per_device.emplace_back(bucket.device, copy_to(found_inf, bucket.device));
      inv_scale_per_device.push_back(copy_to(inv_scale, bucket.device));
    }
    at::_amp_foreach_non_finite_check_and_unscale_(bucket.grads, found_inf_per_device[d].second,
                                                   inv_scale_per_device[d]);
  }
  return found_inf_per_device;
}

void GradScaler::agree(std::vector<std::pair<c10::Device, at::Tensor>>& per_device) const {
  if (!found_inf_reducer_) {
    return;
  }
  at::Tensor flag = per_device.empty() ? at::zeros({}, scale_.options()) : summed_found_inf(per_device, scale_.device());
  found_inf_reducer_(flag);
  per_device = {{scale_.device(), flag}};
}

void GradScaler::unscale_(torch::optim::Optimizer& opt) {
  if (!enabled_) {
    return;
  }
  check_scale_initialized("unscale_");
  auto& state = per_optimizer_states_[&opt];
  if (state.stage == OptState::UNSCALED) {
    throw std::logic_error("unscale_() has already been called on this optimizer since the last update()");
  }
  if (state.stage == OptState::STEPPED) {
    throw std::logic_error("unscale_() is being called after step()");
  }
  // The reciprocal in float64: float32 division can be imprecise under some compile options (as Python says).
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  const at::Tensor found_inf = at::zeros({}, scale_.options());
  state.found_inf_per_device = unscale_grads(opt, inv_scale, found_inf);
  agree(state.found_inf_per_device);
  state.stage = OptState::UNSCALED;
}

bool GradScaler::step(torch::optim::Optimizer& opt) {
  if (!enabled_) {
    opt.step();
    return true;
  }
  check_scale_initialized("step");
  auto& state = per_optimizer_states_[&opt];  // references into an unordered_map survive rehashing
  if (state.stage == OptState::STEPPED) {
    throw std::logic_error("step() has already been called since the last update()");
  }
  auto* scaled = dynamic_cast<optim::ScaledStep*>(&opt);
  if (scaled != nullptr && scaled->takes_found_inf()) {
    // As PyTorch's GradScaler with a fused optimizer: ATen's fused kernels divide by the scale themselves and
    // skip on the device where found_inf is set; nothing is read on the host. Unless unscale_() ran, the
    // gradients are only checked here (multiplied by 1).
    at::Tensor grad_scale;
    if (state.stage == OptState::READY) {
      state.found_inf_per_device = unscale_grads(opt, at::ones({}, scale_.options()), at::zeros({}, scale_.options()));
      agree(state.found_inf_per_device);
      grad_scale = scale_;
    }
    scaled->step_found_inf(grad_scale, summed_found_inf(state.found_inf_per_device, scale_.device()));
    state.stage = OptState::STEPPED;
    return true;
  }
  if (state.stage == OptState::READY) {
    // A fused trainkit optimizer unscales inside its own pass: check for overflow (read-only), then let it
    // step with the inverse scale, skipping when an inf or NaN was found; the gradients stay scaled.
    if (scaled != nullptr && scale_.device().is_cpu()) {
      if (const auto grads = fused_checkable_grads(opt)) {
        const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
        state.found_inf_per_device = {{c10::Device(c10::kCPU), at::full({}, any_nonfinite(*grads) ? 1.0f : 0.0f, scale_.options())}};
        agree(state.found_inf_per_device);
        const at::Tensor found_inf = state.found_inf_per_device.front().second;
        const bool overflow = found_inf.item<float>() != 0.0f;
        scaled->step_scaled(inv_scale, found_inf);
        state.stage = OptState::STEPPED;
        return !overflow;
      }
    }
    unscale_(opt);
  }
  // One host read for all devices together.
  const bool clean = summed_found_inf(state.found_inf_per_device, scale_.device()).item<float>() == 0.0f;
  if (clean) {
    opt.step();
  }
  state.stage = OptState::STEPPED;
  return clean;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!enabled_) {
    return;
  }
  check_scale_initialized("update");
  if (new_scale) {
    scale_.fill_(*new_scale);
  } else {
    at::Tensor combined;
    for (const auto& [key, state] : per_optimizer_states_) {
      for (const auto& [device, found_inf] : state.found_inf_per_device) {
        const at::Tensor here = found_inf.to(scale_.device(), /*non_blocking=*/true);
        combined = combined.defined() ? combined + here : here.clone();
      }
    }
    if (!combined.defined()) {
      throw std::logic_error("GradScaler: no inf checks were recorded prior to update(); call step() first");
    }
    at::_amp_update_scale_(scale_, growth_tracker_, combined, growth_factor_, backoff_factor_, growth_interval_);
  }
  per_optimizer_states_.clear();
}

double GradScaler::get_scale() const {
  if (!enabled_) {
    return 1.0;
  }
  return scale_.defined() ? scale_.item<double>() : init_scale_;
}

int64_t GradScaler::get_growth_tracker() const {
  if (!enabled_) {
    return 0;
  }
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : init_growth_tracker_;
}

OptState GradScaler::stage(const torch::optim::Optimizer& opt) const {
  const auto it = per_optimizer_states_.find(&opt);
  return it == per_optimizer_states_.end() ? OptState::READY : it->second.stage;
}

void GradScaler::set_growth_factor(double factor) {
  check(GradScalerOptions().growth_factor(factor));
  growth_factor_ = factor;
}

void GradScaler::set_backoff_factor(double factor) {
  check(GradScalerOptions().backoff_factor(factor));
  backoff_factor_ = factor;
}

void GradScaler::set_growth_interval(int64_t interval) {
  check(GradScalerOptions().growth_interval(interval));
  growth_interval_ = interval;
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("version", at::scalar_tensor(kStateVersion, at::kLong));
  if (!enabled_) {
    return;
  }
  archive.write("scale", at::scalar_tensor(get_scale(), at::kDouble));
  archive.write("growth_factor", at::scalar_tensor(growth_factor_, at::kDouble));
  archive.write("backoff_factor", at::scalar_tensor(backoff_factor_, at::kDouble));
  archive.write("growth_interval", at::scalar_tensor(growth_interval_, at::kLong));
  archive.write("_growth_tracker", at::scalar_tensor(get_growth_tracker(), at::kLong));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  if (!enabled_) {
    return;
  }
  // A fresh tensor per key: reading into a defined tensor would set_() it to the saved storage, whatever its dtype.
  at::Tensor version;
  if (archive.try_read("version", version) && version.item<int64_t>() > kStateVersion) {
    throw std::runtime_error(fmt::format("GradScaler: saved state has version {}, this trainkit reads up to {}",
                                         version.item<int64_t>(), kStateVersion));
  }
  at::Tensor saved_scale;
  if (!archive.try_read("scale", saved_scale)) {
    throw std::runtime_error(
        "GradScaler: the saved state is empty, possibly because it was saved from a disabled GradScaler");
  }
  const double scale = saved_scale.item<double>();
  const auto read = [&archive](const char* key) {
    at::Tensor v;
    archive.read(key, v);
    return v;
  };
  const double growth_factor = read("growth_factor").item<double>();
  const double backoff_factor = read("backoff_factor").item<double>();
  const int64_t growth_interval = read("growth_interval").item<int64_t>();
  const int64_t growth_tracker = read("_growth_tracker").item<int64_t>();
  // The saved scale is checked as the initial scale it becomes.
  check(GradScalerOptions()
            .init_scale(scale)
            .growth_factor(growth_factor)
            .backoff_factor(backoff_factor)
            .growth_interval(growth_interval),
        "GradScaler: the saved state");

  init_scale_ = scale;
  growth_factor_ = growth_factor;
  backoff_factor_ = backoff_factor;
  growth_interval_ = growth_interval;
  init_growth_tracker_ = growth_tracker;
  if (scale_.defined()) {
    scale_.fill_(scale);
    growth_tracker_.fill_(growth_tracker);
  }
}

}  // namespace trainkit::amp
