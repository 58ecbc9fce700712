#include "trainkit/optim/optimizer_base.h"

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

}  // namespace trainkit::optim::internal
