#include "trainkit/sched/plateau.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/sched/factory.h"

namespace trainkit::sched {

void ReduceLROnPlateau::validate(const ReduceLROnPlateauOptions& o) {
  check_options(ReduceLROnPlateauOptions::binding(), o, "ReduceLROnPlateau");
}

ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  validate(options_);
  const auto& m = options_.min_lr();
  if (m.size() == 1) {
    min_lrs_.assign(num_groups(), m[0]);
  } else if (m.size() == num_groups()) {
    min_lrs_ = m;
  } else {
    throw std::invalid_argument(
        fmt::format("ReduceLROnPlateau: expected {} min_lrs (one per param group), got {}", num_groups(), m.size()));
  }
  best_ = options_.mode() == "min" ? std::numeric_limits<double>::infinity()
                                   : -std::numeric_limits<double>::infinity();
  last_epoch_ = 0;  // PyTorch's plateau scheduler takes no initial step
}

void ReduceLROnPlateau::step() {
  throw std::logic_error("ReduceLROnPlateau needs the metric: call step(metric)");
}

bool ReduceLROnPlateau::is_better(double a, double best) const {
  const double t = options_.threshold();
  const bool rel = options_.threshold_mode() == "rel";
  if (options_.mode() == "min") {
    return rel ? a < best * (1.0 - t) : a < best - t;
  }
  return rel ? a > best * (t + 1.0) : a > best + t;
}

void ReduceLROnPlateau::step(double metric) {
  ++step_count_;
  if (is_better(metric, best_)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;
  }
  reduce_ = num_bad_epochs_ > options_.patience();
  if (reduce_) {
    cooldown_counter_ = options_.cooldown();
    num_bad_epochs_ = 0;
  }
  update_lr();
  reduce_ = false;
}

std::vector<double> ReduceLROnPlateau::get_lr() {
  std::vector<double> lrs = group_lrs();
  if (reduce_) {
    for (size_t i = 0; i < lrs.size(); ++i) {
      const double new_lr = std::max(lrs[i] * options_.factor(), min_lrs_[i]);
      if (lrs[i] - new_lr > options_.eps()) {
        lrs[i] = new_lr;
      }
    }
  }
  return lrs;
}

void ReduceLROnPlateau::save_extra(torch::serialize::OutputArchive& archive) const {
  archive.write("best", torch::tensor(best_, torch::kFloat64));
  archive.write("num_bad_epochs", torch::tensor(num_bad_epochs_));
  archive.write("cooldown_counter", torch::tensor(cooldown_counter_));
}

void ReduceLROnPlateau::load_extra(torch::serialize::InputArchive& archive) {
  at::Tensor t;
  archive.read("best", t);
  best_ = t.item<double>();
  archive.read("num_bad_epochs", t);
  num_bad_epochs_ = t.item<int64_t>();
  archive.read("cooldown_counter", t);
  cooldown_counter_ = t.item<int64_t>();
}

bool register_plateau_scheduler() {
  register_scheduler("ReduceLROnPlateau", "epoch", [](ArgReader& a, const std::string& interval) {
    if (interval != "epoch") {
      a.fail("ReduceLROnPlateau steps once per epoch on the validation loss; interval must be \"epoch\"");
    }
    ReduceLROnPlateauOptions o;
    read_options(ReduceLROnPlateauOptions::binding(), a, o);
    return validated_maker<ReduceLROnPlateau>(a, o);
  }, scheduler_arg_docs(ReduceLROnPlateauOptions::binding(), ReduceLROnPlateauOptions()));
  return true;
}

}  // namespace trainkit::sched
