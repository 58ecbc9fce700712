#pragma once
// Bitwise comparison of two models' parameters and buffers and two optimizers' per-parameter state.
#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "trainkit/compat.h"

namespace trainkit::test {

inline void require_bitwise_equal_modules(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (const auto& item : pa) {
    INFO("parameter " << item.key());
    REQUIRE(torch::equal(item.value(), pb[item.key()]));
  }
  const auto ba = a.named_buffers();
  const auto bb = b.named_buffers();
  REQUIRE(ba.size() == bb.size());
  for (const auto& item : ba) {
    INFO("buffer " << item.key());
    REQUIRE(torch::equal(item.value(), bb[item.key()]));
  }
}

/// Adam's state (step, exp_avg, exp_avg_sq) for every parameter, bitwise.
inline void require_bitwise_equal_adam(torch::optim::Optimizer& a, torch::nn::Module& ma, torch::optim::Optimizer& b,
                                       torch::nn::Module& mb) {
  const auto pa = ma.parameters();
  const auto pb = mb.parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO("optimizer state of parameter " << i);
    auto& sa = static_cast<torch::optim::AdamParamState&>(*a.state().at(compat::param_state_key(pa[i])));
    auto& sb = static_cast<torch::optim::AdamParamState&>(*b.state().at(compat::param_state_key(pb[i])));
    REQUIRE(sa.step() == sb.step());
    REQUIRE(torch::equal(sa.exp_avg(), sb.exp_avg()));
    REQUIRE(torch::equal(sa.exp_avg_sq(), sb.exp_avg_sq()));
  }
}

}  // namespace trainkit::test
