#include "trainkit/train/callback.h"

#include <stdexcept>

#include <fmt/format.h>

namespace trainkit::train {

double monitored_value(const EpochEvent& event, const std::string& monitor, const std::string& who) {
  if (const auto v = event.metrics.find(monitor)) {
    return *v;
  }
  std::string names;
  for (const auto& [name, value] : event.metrics.items()) {
    names += (names.empty() ? "" : ", ") + name;
  }
  throw std::invalid_argument(fmt::format("{}: monitored metric \"{}\" was not measured in epoch {} (there are: {})",
                                          who, monitor, event.epoch, names));
}

void add_eval_metrics(EpochEvent& event, const std::string& prefix, const EvalResult& result) {
  event.metrics.set(prefix + "loss", result.loss);
  for (const auto& [name, value] : result.metrics.items()) {
    event.metrics.set(prefix + name, value);
  }
}

ValueRule<std::string> epoch_metric_rule() {
  return rule::text_where("string", "\"train/loss\" or \"val/<loss or metric>\" or \"val_ema/<loss or metric>\"",
                          [](const std::string& v) {
                            return v == "train/loss" || v.rfind("val/", 0) == 0 || v.rfind("val_ema/", 0) == 0;
                          });
}

}  // namespace trainkit::train
