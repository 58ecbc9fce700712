#pragma once
// What every trainkit optimizer's step shares: closures, per-parameter state, the fused-or-reference
// decision and the threaded loop over chunks.

#include <optional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "optim/detail/kernels.h"

namespace trainkit::optim::detail {

/// Runs `closure` with gradients enabled (the step itself runs under NoGradGuard), as PyTorch does.
inline at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) {
    return {};
  }
  at::AutoGradMode enable_grad(true);
  return closure();
}

/// The state of `p` in `optimizer`, created by `init()` on first use.
template <class State, class Init>
State& param_state(torch::optim::Optimizer& optimizer, const at::Tensor& p, Init&& init) {
  auto& states = optimizer.state();
  auto it = states.find(p.unsafeGetTensorImpl());
  if (it == states.end()) {
    auto fresh = std::make_unique<State>();
    init(*fresh);
    it = states.emplace(p.unsafeGetTensorImpl(), std::move(fresh)).first;
  }
  return static_cast<State&>(*it->second);
}

/// The gradient of `p` (index `index` in its group), checked: dense, same dtype and device as `p`.
inline const at::Tensor& checked_grad(const at::Tensor& p, size_t group, size_t index, const char* optimizer) {
  const at::Tensor& g = p.grad();
  TORCH_CHECK(!g.is_sparse(), optimizer, ": parameter ", index, " of param group ", group,
              " has a sparse gradient, which is not supported");
  return g;
}

/// Whether the fused CPU kernel can take all these tensors: contiguous, CPU, float32 or float64, one dtype.
inline bool fusable(const std::vector<at::Tensor>& tensors, std::string* why) {
  if (tensors.empty()) {
    return true;
  }
  const auto dtype = tensors.front().scalar_type();
  for (const auto& t : tensors) {
    std::string reason;
    if (!t.device().is_cpu()) {
      reason = fmt::format("a tensor is on {}", t.device().str());
    } else if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble) {
      reason = fmt::format("a tensor has dtype {}", c10::toString(t.scalar_type()));
    } else if (t.scalar_type() != dtype) {
      reason = "the tensors mix float32 and float64";
    } else if (!t.is_contiguous()) {
      reason = "a tensor is not contiguous";
    }
    if (!reason.empty()) {
      if (why != nullptr) {
        *why = reason;
      }
      return false;
    }
  }
  return true;
}

/// Picks the path for one group: `fused` unset → fused when possible; true → fused or throw; false → reference.
inline bool use_fused(const std::optional<bool>& fused, const std::vector<at::Tensor>& tensors, const char* optimizer,
                      size_t group) {
  if (fused.has_value() && !*fused) {
    return false;
  }
  std::string why;
  const bool ok = fusable(tensors, &why);
  TORCH_CHECK(ok || !fused.has_value(), optimizer, ": fused=true but param group ", group,
              " cannot use the fused CPU kernel: ", why);
  return ok;
}

/// Puts back the options that the caller gave each param group. Recent LibTorch (2.9+) merges a group's
/// options with the defaults only for its own optimizer types and keeps the defaults for any other type,
/// which would silently drop layer-wise learning rates; trainkit uses a group's options as given.
inline void restore_group_options(torch::optim::Optimizer& opt,
                                  const std::vector<torch::optim::OptimizerParamGroup>& given) {
  for (size_t i = 0; i < given.size() && i < opt.param_groups().size(); ++i) {
    if (given[i].has_options()) {
      const torch::optim::OptimizerOptions& options = given[i].options();
      opt.param_groups()[i].set_options(options.clone());
    }
  }
}

/// Throws when a param group carries options of another optimizer type (e.g. LibTorch's AdamOptions given to
/// trainkit's Adam), which the step would otherwise misread.
template <class Options>
void check_group_options(const torch::optim::Optimizer& opt, const char* optimizer, const char* options) {
  const auto& groups = opt.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    if (dynamic_cast<const Options*>(&groups[i].options()) == nullptr) {
      throw std::invalid_argument(fmt::format("{}: param group {} has options of another optimizer (expected {})",
                                              optimizer, i, options));
    }
  }
}

/// Calls fn(chunk) for every chunk, spread over ATen's intra-op threads.
template <class Fn>
void for_each_chunk(const std::vector<Chunk>& chunks, const Fn& fn) {
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      fn(chunks[static_cast<size_t>(c)]);
    }
  });
}

/// The numel of each tensor.
inline std::vector<int64_t> numels_of(const std::vector<at::Tensor>& tensors) {
  std::vector<int64_t> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    out.push_back(t.numel());
  }
  return out;
}

/// The value of a 0-dim CPU tensor (or 1.0/0.0 when undefined). Reading a CPU scalar is no device sync.
inline double cpu_scalar(const at::Tensor& t, double if_undefined) {
  if (!t.defined()) {
    return if_undefined;
  }
  return t.device().is_cpu() ? t.item<double>() : t.to(at::kCPU).item<double>();
}

/// Checks a value of an option; throws std::invalid_argument naming the optimizer, option and value.
inline void check_option(bool ok, const char* optimizer, const char* what, double value) {
  if (!ok) {
    throw std::invalid_argument(fmt::format("{}: invalid {}: {}", optimizer, what, value));
  }
}

}  // namespace trainkit::optim::detail
