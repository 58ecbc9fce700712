#pragma once
/// @file
/// Param-group helpers: the usual split that keeps biases and norm weights out of weight decay (and so out
/// of LARS/LAMB adaptation), as timm's param_groups_weight_decay does.

#include <vector>

#include <torch/optim/optimizer.h>

namespace trainkit::optim {

/// Two groups: first the parameters with ndim ≤ 1 (biases, norm weights) with weight_decay 0, then the
/// others with `options` as given. Works with any options type that has a weight_decay setter (trainkit's
/// and LibTorch's). Empty groups are left out.
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> weight_decay_param_groups(const std::vector<at::Tensor>& params,
                                                                         const Options& options) {
  std::vector<at::Tensor> no_decay;
  std::vector<at::Tensor> decay;
  for (const auto& p : params) {
    (p.dim() <= 1 ? no_decay : decay).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!no_decay.empty()) {
    Options zero = options;
    zero.weight_decay(0.0);
    groups.emplace_back(no_decay, std::make_unique<Options>(zero));
  }
  if (!decay.empty()) {
    groups.emplace_back(decay, std::make_unique<Options>(options));
  }
  return groups;
}

}  // namespace trainkit::optim
