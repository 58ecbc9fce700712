#include "trainkit/train/callbacks/metrics_logger.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "trainkit/sched/cyclic.h"
#include "trainkit/train/trainer.h"
#include "detail/check.h"

namespace trainkit::train {
namespace {

double lr_of(Trainer& trainer) {
  const auto& groups = trainer.optimizer().param_groups();
  return groups.empty() ? 0.0 : groups.front().options().get_lr();
}

/// Every param group's LR and momentum (or beta1) by monitor name: the one place the names are made.
std::vector<std::pair<std::string, double>> group_monitors(const torch::optim::Optimizer& optimizer) {
  std::vector<std::pair<std::string, double>> out;
  const auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    out.emplace_back(fmt::format("lr_group_{}", i), groups[i].options().get_lr());
    if (sched::has_cyclable_momentum(groups[i])) {
      out.emplace_back(fmt::format("momentum_group_{}", i), sched::get_cyclable_momentum(groups[i]));
    }
  }
  return out;
}

/// The monitors of monitor_columns() with their current values; the gradient norm is `grad_norm` (read).
std::vector<std::pair<std::string, double>> monitor_values(Trainer& trainer, std::optional<double> grad_norm) {
  std::vector<std::pair<std::string, double>> out = group_monitors(trainer.optimizer());
  if (grad_norm) {
    out.emplace_back("grad_norm", *grad_norm);
  }
  return out;
}

}  // namespace

std::vector<std::string> MetricsLogger::monitor_columns(const torch::optim::Optimizer& optimizer, bool grad_norm) {
  std::vector<std::string> out;
  for (const auto& [name, value] : group_monitors(optimizer)) {
    out.push_back(name);
  }
  if (grad_norm) {
    out.emplace_back("grad_norm");
  }
  return out;
}

MetricsLogger::MetricsLogger(std::shared_ptr<log::MetricsWriter> metrics, int64_t every_steps, bool bar,
                                 std::shared_ptr<log::SummaryWriter> tensorboard)
    : metrics_(std::move(metrics)), tensorboard_(std::move(tensorboard)), every_steps_(every_steps), bar_(bar) {
  TRAINKIT_CHECK_ARG(every_steps_ >= 1, "MetricsLogger: invalid every_steps: {}", every_steps_);
}

void MetricsLogger::on_train_begin(Trainer&) {
  epoch_times_.clear();
  clipped_steps_ = at::Tensor();
  interval_loss_ = at::Tensor();
  interval_steps_ = interval_samples_ = 0;
  interval_seconds_ = 0;
  last_ = Clock::now();
}

bool MetricsLogger::on_step_end(Trainer& trainer, const StepEvent& event) {
  const auto now = Clock::now();
  const double dt = std::chrono::duration<double>(now - last_).count();
  interval_seconds_ += dt;
  total_seconds_ += dt;
  // Summed where the loss is: the row's values are copied to the host together, once per row.
  const at::Tensor loss = event.loss.to(torch::kFloat64);
  interval_loss_ = interval_loss_.defined() ? interval_loss_ + loss : loss;
  ++interval_steps_;
  interval_samples_ += event.samples;
  total_samples_ += event.samples;
  const double max_norm = trainer.options().clip_grad_norm();
  if (max_norm > 0 && trainer.last_grad_norm().defined()) {
    const at::Tensor clipped = (max_norm / (trainer.last_grad_norm() + 1e-6) < 1.0).to(torch::kLong);
    clipped_steps_ = clipped_steps_.defined() ? clipped_steps_ + clipped : clipped;
  }
  if (event.step % every_steps_ == 0) {
    const at::Tensor& norm = trainer.last_grad_norm();
    const at::Tensor values =
        norm.defined() ? torch::stack({interval_loss_, norm.detach().to(interval_loss_.device(), torch::kFloat64)}).cpu()
                       : interval_loss_.reshape({1}).cpu();
    const double* read = values.data_ptr<double>();
    last_loss_ = read[0] / static_cast<double>(interval_steps_);
    last_rate_ = interval_seconds_ > 0 ? static_cast<double>(interval_samples_) / interval_seconds_ : 0.0;
    // Monitors: every group's LR and momentum (or beta1), and the norm the clip computed (no second pass).
    const auto monitors = monitor_values(trainer, norm.defined() ? std::optional<double>(read[1]) : std::nullopt);
    if (metrics_) {
      log::MetricRow row;
      row.kind = "train";
      row.step = event.step;
      row.epoch = event.epoch;
      row.loss = last_loss_;
      row.lr = lr_of(trainer);
      row.samples_per_second = last_rate_;
      row.monitors = monitors;
      metrics_->write(row);
    }
    if (tensorboard_) {
      tensorboard_->add_scalar("train/loss", last_loss_, event.step);
      tensorboard_->add_scalar("train/lr", lr_of(trainer), event.step);
      tensorboard_->add_scalar("train/samples_per_second", last_rate_, event.step);
      for (const auto& [name, value] : monitors) {
        // TensorBoard tags as before: train/lr/group_<i>, train/momentum/group_<i>, train/grad_norm.
        const size_t group = name.rfind("_group_");
        const std::string tag = group == std::string::npos
                                    ? "train/" + name
                                    : "train/" + name.substr(0, group) + "/group_" + name.substr(group + 7);
        tensorboard_->add_scalar(tag, value, event.step);
      }
    }
    if (!bar_) {
      spdlog::info("epoch {} step {} batch {}/{} loss {:.4f} lr {:.3g} {:.0f} samples/s", event.epoch + 1,
                   event.step, event.batch + 1,
                   event.num_batches == data::BatchSource::kUnknownLength ? std::string("?")
                                                                          : std::to_string(event.num_batches),
                   last_loss_, lr_of(trainer), last_rate_);
    }
    interval_loss_ = at::Tensor();
    interval_steps_ = interval_samples_ = 0;
    interval_seconds_ = 0;
  }
  if (bar_) {
    progress_.update(fmt::format("epoch {}/{}", event.epoch + 1, trainer.options().epochs()), event.batch + 1,
                     event.num_batches, fmt::format("loss {:.4f} {:.0f} samples/s", last_loss_, last_rate_));
  }
  last_ = Clock::now();
  return false;
}

bool MetricsLogger::on_validation_point(Trainer& trainer, const EpochEvent& event) {
  if (!event.epoch_end && event.val) {  // the epoch's end is written by on_epoch_end
    write_validation(trainer, event);
  }
  return false;
}

bool MetricsLogger::on_epoch_end(Trainer& trainer, const EpochEvent& event) {
  write_validation(trainer, event);
  return false;
}

void MetricsLogger::write_validation(Trainer& trainer, const EpochEvent& event) {
  progress_.finish();
  log::MetricRow row;
  row.kind = event.epoch_end ? "epoch" : "val";
  row.step = event.step;
  row.epoch = event.epoch;
  row.loss = event.train_loss;
  row.lr = lr_of(trainer);
  for (const auto& [name, value] : event.metrics.items()) {  // what hooks added (val_ema/loss, ...)
    if (name.rfind("train/", 0) != 0 && name.rfind("val/", 0) != 0) {
      row.monitors.emplace_back(name, value);
    }
  }
  const std::string where = event.epoch_end ? fmt::format("epoch {} done", event.epoch + 1)
                                            : fmt::format("epoch {} step {} validation", event.epoch + 1, event.step);
  if (event.val) {
    row.val_loss = event.val->loss;
    row.val_metrics = event.val->metrics.items();
    std::string values;
    for (const auto& [name, value] : event.val->metrics.items()) {
      values += fmt::format(", val {} {:.4f}", name, value);
    }
    spdlog::info("{}: train loss {:.4f}, val loss {:.4f}{}", where, event.train_loss, event.val->loss, values);
  } else {
    spdlog::info("{}: train loss {:.4f}", where, event.train_loss);
  }
  if (event.epoch_end && event.times.steps > 0) {
    spdlog::info("epoch {} time: {}", event.epoch + 1, event.times.to_string());
    epoch_times_.push_back(event.times);
  }
  if (metrics_) {
    metrics_->write(row);
  }
  if (tensorboard_) {
    if (event.epoch_end) {
      tensorboard_->add_scalar("epoch/train_loss", event.train_loss, event.step);
    }
    if (event.val) {
      tensorboard_->add_scalar("val/loss", event.val->loss, event.step);
      for (const auto& [name, value] : event.val->metrics.items()) {
        tensorboard_->add_scalar("val/" + name, value, event.step);
      }
    }
    for (const auto& [name, value] : row.monitors) {  // what hooks added (val_ema/loss, ...)
      tensorboard_->add_scalar(name, value, event.step);
    }
  }
  last_ = Clock::now();  // evaluation time is not training time
}

StepTimes MetricsLogger::step_times() const {
  StepTimes sum;
  for (const StepTimes& t : epoch_times_) {
    sum += t;
  }
  return sum;
}

int64_t MetricsLogger::clipped_steps() const {
  return clipped_steps_.defined() ? clipped_steps_.item<int64_t>() : 0;
}

void MetricsLogger::on_train_end(Trainer& trainer) {
  if (trainer.state().batch > 0 && trainer.epoch_times().steps > 0) {  // stopped mid-epoch
    epoch_times_.push_back(trainer.epoch_times());
  }
  progress_.finish();
  if (tensorboard_) {
    tensorboard_->flush();
  }
}

}  // namespace trainkit::train
