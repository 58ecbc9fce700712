#include "trainkit/train/callbacks/early_stopping.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::train {

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  TRAINKIT_CHECK_ARG(options_.mode() == "min" || options_.mode() == "max",
                     "EarlyStopping: invalid mode \"{}\" (\"min\" or \"max\")", options_.mode());
  TRAINKIT_CHECK_ARG(options_.patience() >= 0, "EarlyStopping: invalid patience: {}", options_.patience());
  TRAINKIT_CHECK_ARG(options_.min_delta() >= 0, "EarlyStopping: invalid min_delta: {}", options_.min_delta());
  TRAINKIT_CHECK_ARG(!options_.monitor().empty(), "EarlyStopping: monitor must not be empty");
  max_ = options_.mode() == "max";
  best_ = max_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
}

bool EarlyStopping::check(double current) {
  reason_.clear();
  // Lightning flips min_delta's sign for "min" and tests monitor_op(current - min_delta, best).
  const double delta = max_ ? options_.min_delta() : -options_.min_delta();
  if (options_.check_finite() && !std::isfinite(current)) {
    reason_ = fmt::format("{} = {} is not finite", options_.monitor(), current);
  } else if (options_.stopping_threshold() && better(current, *options_.stopping_threshold())) {
    reason_ = fmt::format("{} = {} reached the stopping threshold {}", options_.monitor(), current,
                          *options_.stopping_threshold());
  } else if (options_.divergence_threshold() && better(-current, -*options_.divergence_threshold())) {
    reason_ = fmt::format("{} = {} passed the divergence threshold {}", options_.monitor(), current,
                          *options_.divergence_threshold());
  } else if (better(current - delta, best_)) {
    best_ = current;
    wait_ = 0;
  } else {
    ++wait_;
    if (wait_ >= options_.patience()) {
      reason_ = fmt::format("{} did not improve in the last {} epochs (best {})", options_.monitor(), wait_, best_);
    }
  }
  return !reason_.empty();
}

bool EarlyStopping::on_validation_point(Trainer& trainer, const EpochEvent& event) {
  if (!check(monitored_value(event, options_.monitor(), "EarlyStopping"))) {
    return false;
  }
  stopped_epoch_ = event.epoch;
  if (event.epoch_end) {
    spdlog::info("early stopping after epoch {}: {}", event.epoch + 1, reason_);
  } else {
    spdlog::info("early stopping at step {} (epoch {}): {}", event.step, event.epoch + 1, reason_);
  }
  return true;
}

void EarlyStopping::save(torch::serialize::OutputArchive& archive) const {
  archive.write("best_score", torch::tensor(best_, torch::kFloat64));
  archive.write("wait_count", torch::tensor(wait_));
  archive.write("stopped_epoch", torch::tensor(stopped_epoch_));
}

void EarlyStopping::load(torch::serialize::InputArchive& archive) {
  // A fresh tensor per key: reading into a defined tensor would copy into its dtype.
  const auto read = [&archive](const char* key) {
    at::Tensor t;
    archive.read(key, t);
    return t;
  };
  best_ = read("best_score").item<double>();
  wait_ = read("wait_count").item<int64_t>();
  stopped_epoch_ = read("stopped_epoch").item<int64_t>();
}

}  // namespace trainkit::train
