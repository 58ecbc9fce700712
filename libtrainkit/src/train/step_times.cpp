#include "trainkit/train/step_times.h"

#include <fmt/format.h>

namespace trainkit::train {

StepTimes& StepTimes::operator+=(const StepTimes& o) {
  data += o.data;
  forward += o.forward;
  backward += o.backward;
  optimizer += o.optimizer;
  callbacks += o.callbacks;
  total += o.total;
  validation += o.validation;
  steps += o.steps;
  micro_batches += o.micro_batches;
  return *this;
}

std::string StepTimes::to_string() const {
  const auto pct = [this](double part) { return total > 0 ? 100.0 * part / total : 0.0; };
  const double per_step = steps > 0 ? 1e3 * total / static_cast<double>(steps) : 0.0;
  return fmt::format(
      "{:.1f} s in {} steps ({:.1f} ms/step): data {:.1f}%, forward {:.1f}%, backward {:.1f}%, optimizer {:.1f}%, "
      "callbacks {:.1f}%, other {:.1f}%; validation {:.1f} s",
      total, steps, per_step, pct(data), pct(forward), pct(backward), pct(optimizer), pct(callbacks), pct(other()),
      validation);
}

std::string StepTimes::to_json() const {
  return fmt::format(
      "{{\"steps\": {}, \"micro_batches\": {}, \"total_s\": {:.6f}, \"data_s\": {:.6f}, \"forward_s\": {:.6f}, "
      "\"backward_s\": {:.6f}, \"optimizer_s\": {:.6f}, \"callbacks_s\": {:.6f}, \"other_s\": {:.6f}, "
      "\"validation_s\": {:.6f}}}",
      steps, micro_batches, total, data, forward, backward, optimizer, callbacks, other(), validation);
}

}  // namespace trainkit::train
