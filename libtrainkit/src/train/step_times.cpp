#include "trainkit/train/step_times.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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
  const nlohmann::ordered_json json = {{"steps", steps},
                                       {"micro_batches", micro_batches},
                                       {"total_s", total},
                                       {"data_s", data},
                                       {"forward_s", forward},
                                       {"backward_s", backward},
                                       {"optimizer_s", optimizer},
                                       {"callbacks_s", callbacks},
                                       {"other_s", other()},
                                       {"validation_s", validation}};
  return json.dump();
}

}  // namespace trainkit::train
