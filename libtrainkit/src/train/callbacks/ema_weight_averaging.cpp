#include "trainkit/train/callbacks/ema_weight_averaging.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "trainkit/train/trainer.h"

namespace trainkit::train {

EMAWeightAveraging::EMAWeightAveraging(const torch::nn::Module& model, ModelEmaOptions options)
    : ema_(model, options) {}

bool EMAWeightAveraging::on_step_end(Trainer& trainer, const StepEvent& event) {
  ema_.update(trainer.module(), event.step);
  return false;
}

EvalResult EMAWeightAveraging::evaluate(Trainer& trainer, data::BatchSource& source) {
  ScopedWeights scope(trainer.module(), ema_.values());
  return trainer.evaluate(source);
}

void EMAWeightAveraging::on_validation_end(Trainer& trainer, data::BatchSource* val, EpochEvent& event) {
  if (val == nullptr) {
    return;
  }
  const EvalResult r = evaluate(trainer, *val);
  add_eval_metrics(event, "val_ema/", r);
  std::string values;
  for (const auto& [name, value] : r.metrics.items()) {
    values += fmt::format(", {} {:.4f}", name, value);
  }
  spdlog::info("epoch {}{} EMA weights: val loss {:.4f}{}", event.epoch + 1,
               event.epoch_end ? "" : fmt::format(" step {}", event.step), r.loss, values);
}

}  // namespace trainkit::train
