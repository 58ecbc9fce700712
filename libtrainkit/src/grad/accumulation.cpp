#include "trainkit/grad/accumulation.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace trainkit::grad {

GradAccumulation::GradAccumulation(int64_t accumulation_steps, int64_t micro_batches_per_epoch)
    : steps_(accumulation_steps), per_epoch_(micro_batches_per_epoch) {
  if (steps_ < 1) {
    throw std::invalid_argument("GradAccumulation: invalid accumulation_steps: " + std::to_string(steps_) +
                                " (must be >= 1)");
  }
  if (per_epoch_ < 0) {
    throw std::invalid_argument("GradAccumulation: invalid micro_batches_per_epoch: " + std::to_string(per_epoch_));
  }
}

int64_t GradAccumulation::window_size() const {
  if (per_epoch_ == 0) {
    return steps_;
  }
  const int64_t window_start = (position_ / steps_) * steps_;
  return std::min(steps_, per_epoch_ - window_start);
}

double GradAccumulation::loss_scale() const { return 1.0 / static_cast<double>(window_size()); }

bool GradAccumulation::sync_now() const {
  const int64_t in_window = position_ % steps_;
  return in_window + 1 == window_size();
}

void GradAccumulation::next() {
  ++position_;
  if (per_epoch_ > 0 && position_ == per_epoch_) {
    position_ = 0;
  }
}

void GradAccumulation::seek(int64_t index) {
  if (index < 0 || (per_epoch_ > 0 && index >= per_epoch_)) {
    throw std::out_of_range("GradAccumulation::seek: micro-batch " + std::to_string(index) + " out of range");
  }
  position_ = index;
}

}  // namespace trainkit::grad
