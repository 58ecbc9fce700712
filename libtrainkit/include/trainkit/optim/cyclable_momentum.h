#pragma once
/// @file
/// The interface through which cyclical schedules (sched::CyclicLR, sched::OneCycleLR) read and set an
/// optimizer's momentum. Defined here, in optim, so that optimizers need nothing from sched (sched is the
/// higher layer and uses it).

namespace trainkit::optim {

/// Optimizer options whose momentum CyclicLR/OneCycleLR may cycle, beyond LibTorch's own (SGD and
/// RMSprop `momentum`, Adam and AdamW `beta1`, which are handled directly). Implement it in your options.
class CyclableMomentum {
 public:
  virtual ~CyclableMomentum() = default;
  /// The momentum (or beta1) the scheduler cycles.
  virtual double cycled_momentum() const = 0;
  /// Sets it.
  virtual void set_cycled_momentum(double momentum) = 0;
};

}  // namespace trainkit::optim
