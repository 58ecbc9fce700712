#include "trainkit/optim/optimizer_base.h"

#include <algorithm>
#include <string>

#include <torch/torch.h>

#include "detail/check.h"
#include "detail/parallel.h"

namespace trainkit::optim::internal {

void restore_group_options(torch::optim::Optimizer& optimizer,
                           const std::vector<torch::optim::OptimizerParamGroup>& given) {
  for (std::size_t i = 0; i < given.size() && i < optimizer.param_groups().size(); ++i) {
    if (given[i].has_options()) {
      optimizer.param_groups()[i].set_options(given[i].options().clone());
    }
  }
}

void throw_foreign_options(const char* optimizer, std::size_t group) {
  throw std::invalid_argument(fmt::format("{}: param group {} has options of another optimizer (expected {}Options)",
                                          optimizer, group, optimizer));
}

at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) {
    return {};
  }
  at::AutoGradMode enable_grad(true);
  return closure();
}

bool found_inf(const at::Tensor& found_inf) { return detail::cpu_scalar(found_inf, 0.0) != 0.0; }

const at::Tensor& checked_grad(const at::Tensor& p, std::size_t group, std::size_t index, const char* optimizer) {
  const at::Tensor& g = p.grad();
  TRAINKIT_CHECK_ARG(!g.is_sparse(), "{}: parameter {} of param group {} has a sparse gradient, which is not supported",
                     optimizer, index, group);
  return g;
}

bool use_fused(const std::optional<bool>& fused, const std::vector<at::Tensor>& tensors, const char* optimizer,
               std::size_t group) {
  if (fused.has_value() && !*fused) {
    return false;
  }
  std::string why;
  const bool ok = detail::fusable(tensors, &why);
  TRAINKIT_CHECK_ARG(ok || !fused.has_value(), "{}: fused=true but param group {} cannot use the fused CPU kernel: {}",
                     optimizer, group, why);
  return ok;
}

bool use_foreach(const std::optional<bool>& foreach, const std::optional<bool>& fused,
                 const std::vector<at::Tensor>& tensors, const char* optimizer, std::size_t group) {
  if (foreach.has_value()) {
    TRAINKIT_CHECK_ARG(!*foreach || !fused.value_or(false),
                       "{}: param group {} sets both fused=true and foreach=true; choose one", optimizer, group);
    return *foreach;
  }
  if (fused.value_or(false)) {
    return false;
  }
  return std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return !t.device().is_cpu(); });
}

bool use_aten_fused(const std::optional<bool>& aten_fused, const std::optional<bool>& fused,
                    const std::optional<bool>& foreach, const std::vector<at::Tensor>& params, const char* optimizer,
                    std::size_t group) {
  if (aten_fused.has_value()) {
    TRAINKIT_CHECK_ARG(!*aten_fused || !foreach.value_or(false),
                       "{}: param group {} sets both aten_fused=true and foreach=true; choose one", optimizer, group);
    TRAINKIT_CHECK_ARG(!*aten_fused || fused.value_or(true),
                       "{}: param group {} sets aten_fused=true but fused=false; choose one", optimizer, group);
    return *aten_fused;
  }
  return fused.value_or(false) &&
         std::any_of(params.begin(), params.end(), [](const at::Tensor& t) { return !t.device().is_cpu(); });
}

void check_aten_fusable(const std::vector<at::Tensor>& tensors, const char* optimizer, std::size_t group) {
  std::string why;
  const auto& first = tensors.front();
  for (const auto& t : tensors) {
    if (t.layout() != at::kStrided) {
      why = "a tensor is sparse";
    } else if (t.device() != first.device()) {
      why = fmt::format("the tensors mix {} and {}", first.device().str(), t.device().str());
    } else if (t.scalar_type() != first.scalar_type()) {
      why = fmt::format("the parameters, gradients and state mix {} and {} (ATen's kernels keep state in the "
                        "parameters' dtype; trainkit keeps float32 state for bfloat16/float16 parameters)",
                        c10::toString(first.scalar_type()), c10::toString(t.scalar_type()));
    } else if (!at::isFloatingType(t.scalar_type())) {
      why = fmt::format("a tensor has dtype {}", c10::toString(t.scalar_type()));
    } else if (!t.is_contiguous()) {
      why = "a tensor is not contiguous";
    }
    if (!why.empty()) {
      break;
    }
  }
  TRAINKIT_CHECK_ARG(why.empty(), "{}: param group {} cannot use ATen's fused kernel: {}", optimizer, group, why);
}

namespace {

/// Why the fused kernels cannot take a group with bfloat16/float16 `values` and `state` ("" when they can).
std::string why_not_reduced(const std::vector<at::Tensor>& values, const std::vector<at::Tensor>& state,
                            bool reduced_state_ok) {
  const auto dtype = values.front().scalar_type();
  for (const auto& t : values) {
    if (!t.device().is_cpu()) {
      return fmt::format("a tensor is on {}", t.device().str());
    }
    if (t.scalar_type() != dtype) {
      return fmt::format("the parameters and gradients mix {} and {}", c10::toString(dtype),
                         c10::toString(t.scalar_type()));
    }
    if (!t.is_contiguous()) {
      return "a tensor is not contiguous";
    }
  }
  const auto state_dtype = state.empty() ? at::kFloat : state.front().scalar_type();
  for (const auto& t : state) {
    if (!t.device().is_cpu()) {
      return fmt::format("optimizer state is on {}", t.device().str());
    }
    const bool allowed = state_dtype == at::kFloat || (reduced_state_ok && state_dtype == dtype);
    if (t.scalar_type() != state_dtype || !allowed) {
      return fmt::format("optimizer state of {} parameters has dtype {} (the fused kernel takes float32{})",
                         c10::toString(dtype), c10::toString(t.scalar_type()),
                         reduced_state_ok ? fmt::format(" or {}, one for the whole group", c10::toString(dtype)) : "");
    }
    if (!t.is_contiguous()) {
      return "optimizer state is not contiguous";
    }
  }
  return "";
}

}  // namespace

bool use_fused(const std::optional<bool>& fused, const std::vector<at::Tensor>& values,
               const std::vector<at::Tensor>& state, bool reduced_ok, const char* optimizer, std::size_t group,
               bool reduced_state_ok) {
  if (fused.has_value() && !*fused) {
    return false;
  }
  if (values.empty()) {
    return use_fused(fused, state, optimizer, group);
  }
  const auto dtype = values.front().scalar_type();
  if (!reduced_ok || (dtype != at::kBFloat16 && dtype != at::kHalf)) {
    std::vector<at::Tensor> all = values;
    all.insert(all.end(), state.begin(), state.end());
    return use_fused(fused, all, optimizer, group);
  }
  const std::string why = why_not_reduced(values, state, reduced_state_ok);
  TRAINKIT_CHECK_ARG(why.empty() || !fused.has_value(),
                     "{}: fused=true but param group {} cannot use the fused CPU kernel: {}", optimizer, group, why);
  return why.empty();
}

at::ScalarType state_dtype(at::ScalarType param) {
  return param == at::kBFloat16 || param == at::kHalf ? at::kFloat : param;
}

}  // namespace trainkit::optim::internal
