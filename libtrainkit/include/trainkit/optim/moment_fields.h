#pragma once
/// @file
/// The fields RAdam, NAdam and Adamax share with torch.optim's signatures (lr, betas, eps, weight_decay,
/// maximize) and trainkit's path choice (fused, foreach), with their binding: each Options struct adds its own
/// fields and their lines to moment_binding().

#include <optional>
#include <tuple>

#include "trainkit/optim/cyclable_momentum.h"
#include "trainkit/optim/optimizer_options.h"

namespace trainkit::optim {

/// Fields of an Adam variant's options `Self`, whose default learning rate is `Self::kLr`.
template <class Self>
struct MomentFields : public OptimizerOptions<Self>, public CyclableMomentum {
  using betas_t = std::tuple<double, double>;
  /// Learning rate (>= 0).
  TRAINKIT_SHARED_ARG(double, lr) = Self::kLr;
  /// Coefficients (β1, β2) of the running averages of the gradient and of its square (Adamax: of its
  /// infinity norm), each in [0, 1).
  TRAINKIT_SHARED_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the denominator for numerical stability (>= 0).
  TRAINKIT_SHARED_ARG(double, eps) = 1e-8;
  /// Weight decay (>= 0): the L2 penalty weight_decay·p added to the gradient (RAdam and NAdam: or decoupled).
  TRAINKIT_SHARED_ARG(double, weight_decay) = 0;
  /// Maximize the objective instead of minimizing it.
  TRAINKIT_SHARED_ARG(bool, maximize) = false;
  /// Kernel choice: unset = the fused CPU kernel where every tensor of the group allows it (contiguous
  /// float32/float64 CPU tensors of one dtype), else the ATen reference path; true = fused, or throw;
  /// false = always the reference path.
  TRAINKIT_SHARED_ARG(std::optional<bool>, fused) = std::nullopt;
  /// Multi-tensor ATen path (`_foreach_*` ops, as PyTorch's `foreach=True`): unset = on for tensors that
  /// are not on the CPU (CUDA), where the fused CPU kernel does not run; true = always (no fused kernel).
  TRAINKIT_SHARED_ARG(std::optional<bool>, foreach) = std::nullopt;

 public:
  /// β1, the momentum that CyclicLR/OneCycleLR cycle.
  double cycled_momentum() const override { return std::get<0>(betas_); }
  void set_cycled_momentum(double momentum) override { std::get<0>(betas_) = momentum; }

 protected:
  MomentFields() = default;
  explicit MomentFields(double lr) : lr_(lr) {}

  /// The binding of these fields, with `own(binding)` binding the fields of `Self` after weight_decay.
  template <class Own>
  static OptimizerOptionsBinding<Self> moment_binding(const Own& own) {
    auto b = OptimizerOptionsBinding<Self>()
                 .bind(TRAINKIT_OPTION(lr), non_negative(), "Learning rate")
                 .bind(TRAINKIT_OPTION(betas), unit_interval(), "(beta1, beta2): running-average coefficients")
                 .bind(TRAINKIT_OPTION(eps), non_negative(), "Term added to the denominator")
                 .bind(TRAINKIT_OPTION(weight_decay), non_negative(), "Weight decay (L2 penalty unless decoupled)");
    own(b);
    b.bind(TRAINKIT_OPTION(maximize), "Maximize the objective instead of minimizing it")
        .bind(TRAINKIT_OPTION(fused), kFusedDoc)
        .bind(TRAINKIT_OPTION(foreach), kForeachDoc);
    return b;
  }
};

}  // namespace trainkit::optim
