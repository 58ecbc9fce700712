#include "trainkit/train/trainer.h"

#include <torch/torch.h>

#include "trainkit/amp/autocast.h"
#include "trainkit/grad/accumulation.h"
#include "trainkit/grad/clip.h"
#include "detail/check.h"

namespace trainkit::train {

Trainer::Trainer(std::shared_ptr<torch::nn::Module> module, ForwardFn forward,
                 torch::optim::Optimizer& optimizer, TrainerOptions options)
    : module_(std::move(module)),
      forward_(std::move(forward)),
      optimizer_(optimizer),
      options_(options),
      loss_([](const at::Tensor& out, const at::Tensor& target) {
        return torch::nn::functional::cross_entropy(out, target);
      }) {
  TRAINKIT_CHECK_ARG(module_ != nullptr, "Trainer: module must not be null");
  TRAINKIT_CHECK_ARG(options_.epochs() >= 1, "Trainer: invalid epochs: {}", options_.epochs());
  TRAINKIT_CHECK_ARG(options_.max_steps() >= 0, "Trainer: invalid max_steps: {}", options_.max_steps());
  TRAINKIT_CHECK_ARG(options_.accumulation_steps() >= 1, "Trainer: invalid accumulation_steps: {}",
                     options_.accumulation_steps());
  TRAINKIT_CHECK_ARG(options_.clip_grad_norm() >= 0, "Trainer: invalid clip_grad_norm: {}", options_.clip_grad_norm());
  TRAINKIT_CHECK_ARG(options_.clip_grad_value() >= 0, "Trainer: invalid clip_grad_value: {}",
                     options_.clip_grad_value());
  state_.epoch_loss_sum = torch::zeros({}, torch::kFloat64);
}

void Trainer::set_scheduler(std::shared_ptr<sched::LRScheduler> scheduler, bool per_step) {
  TRAINKIT_CHECK_ARG(scheduler != nullptr, "Trainer::set_scheduler: scheduler must not be null");
  TRAINKIT_CHECK_ARG(!(per_step && scheduler->takes_metric()),
                     "Trainer::set_scheduler: {} steps with a metric once per epoch, not per step", scheduler->name());
  TRAINKIT_CHECK_ARG(&scheduler->optimizer() == &optimizer_, "Trainer::set_scheduler: {} drives a different optimizer",
                     scheduler->name());
  scheduler_ = std::move(scheduler);
  scheduler_per_step_ = per_step;
}

void Trainer::set_autocast(c10::DeviceType device, c10::ScalarType dtype) {
  TRAINKIT_CHECK_ARG(amp::is_autocast_dtype_supported(device, dtype),
                     "Trainer::set_autocast: {} autocast is not supported on {}", c10::toString(dtype),
                     c10::DeviceTypeName(device));
  autocast_ = std::make_pair(device, dtype);
}

std::optional<amp::Autocast> Trainer::autocast_region() const {
  if (!autocast_) {
    return std::nullopt;
  }
  return std::optional<amp::Autocast>(std::in_place, autocast_->first, autocast_->second);
}

at::Tensor Trainer::forward_loss(const data::Batch& batch) {
  const auto guard = autocast_region();
  const at::Tensor loss = loss_(forward_(batch.input()), batch.target());
  // Under autocast the loss is reported and backpropagated from float32, whatever the forward's precision.
  return autocast_ ? loss.to(torch::kFloat32) : loss;
}

at::Tensor Trainer::backward(const data::Batch& batch, double loss_scale) {
  const at::Tensor loss = forward_loss(batch);
  at::Tensor to_backprop = loss_scale == 1.0 ? loss : loss * loss_scale;
  if (scaler_) {
    to_backprop = scaler_->scale(to_backprop);
  }
  to_backprop.backward();
  return loss.detach();
}

void Trainer::optimizer_step() {
  const bool clipping = options_.clip_grad_value() > 0 || options_.clip_grad_norm() > 0;
  if (scaler_ && clipping) {
    scaler_->unscale_(optimizer_);  // clip the true gradients
  }
  if (options_.clip_grad_value() > 0) {
    grad::clip_grad_value_(optimizer_params(), options_.clip_grad_value());
  }
  if (options_.clip_grad_norm() > 0) {
    grad::clip_grad_norm_(optimizer_params(), options_.clip_grad_norm(), options_.norm_type());
  }
  if (scaler_) {
    scaler_->step(optimizer_);
    scaler_->update();
  } else {
    optimizer_.step();
  }
  optimizer_.zero_grad();
}

std::vector<at::Tensor> Trainer::optimizer_params() const {
  std::vector<at::Tensor> params;
  for (const auto& group : optimizer_.param_groups()) {
    params.insert(params.end(), group.params().begin(), group.params().end());
  }
  return params;
}

at::Tensor Trainer::train_step(const data::Batch& batch) {
  optimizer_.zero_grad();
  const at::Tensor loss = backward(batch);
  optimizer_step();
  return loss;
}

EvalResult Trainer::evaluate(const data::TensorLoader& loader) {
  const bool was_training = module_->is_training();
  module_->eval();
  torch::NoGradGuard no_grad;
  at::Tensor loss_sum = torch::zeros({}, torch::kFloat64);
  at::Tensor correct = torch::zeros({}, torch::kInt64);
  int64_t samples = 0;
  for (int64_t i = 0; i < loader.num_batches(); ++i) {
    const data::Batch b = loader.batch(i);
    const auto guard = autocast_region();
    const at::Tensor out = forward_(b.input());
    const int64_t n = b.target().size(0);
    loss_sum += loss_(out, b.target()).to(torch::kCPU, torch::kFloat64) * static_cast<double>(n);
    correct += out.argmax(1).eq(b.target()).sum().to(torch::kCPU);
    samples += n;
  }
  module_->train(was_training);
  EvalResult r;
  r.samples = samples;
  if (samples > 0) {
    r.loss = loss_sum.item<double>() / static_cast<double>(samples);
    r.accuracy = static_cast<double>(correct.item<int64_t>()) / static_cast<double>(samples);
  }
  return r;
}

void Trainer::fit(data::TensorLoader& train, const data::TensorLoader* val) {
  stop_ = false;
  module_->train();
  for (auto& cb : callbacks_) {
    cb->on_train_begin(*this);
  }
  const auto reached_max = [this] { return options_.max_steps() > 0 && state_.step >= options_.max_steps(); };
  stop_ = stop_ || reached_max();
  optimizer_.zero_grad();
  while (state_.epoch < options_.epochs() && !stop_) {
    train.set_epoch(state_.epoch);
    const int64_t num_batches = train.num_batches();
    grad::GradAccumulation accumulation(options_.accumulation_steps(), num_batches);
    accumulation.seek(std::min(state_.batch, num_batches - 1));
    at::Tensor window_loss = torch::zeros({}, torch::kFloat64);
    int64_t window_samples = 0;
    while (state_.batch < num_batches && !stop_) {
      const data::Batch batch = train.batch(state_.batch);
      const at::Tensor loss = backward(batch, accumulation.loss_scale());
      const int64_t n = batch.target().size(0);
      const at::Tensor weighted = loss.to(torch::kCPU, torch::kFloat64) * static_cast<double>(n);
      state_.epoch_loss_sum += weighted;
      state_.epoch_samples += n;
      window_loss += weighted;
      window_samples += n;
      const bool step_now = accumulation.sync_now();
      accumulation.next();
      ++state_.batch;
      if (!step_now) {
        continue;
      }
      optimizer_step();
      if (scheduler_ && scheduler_per_step_) {
        scheduler_->step();
      }
      ++state_.step;
      const StepEvent event{state_.epoch,  state_.batch - 1, num_batches, state_.step, window_samples,
                            window_loss / static_cast<double>(window_samples)};
      window_loss = torch::zeros({}, torch::kFloat64);
      window_samples = 0;
      for (auto& cb : callbacks_) {
        stop_ = cb->on_step_end(*this, event) || stop_;
      }
      stop_ = stop_ || reached_max();
    }
    if (state_.batch < num_batches) {
      break;  // stopped mid-epoch
    }
    EpochEvent event{state_.epoch, state_.step, 0.0, std::nullopt};
    if (state_.epoch_samples > 0) {
      event.train_loss = state_.epoch_loss_sum.item<double>() / static_cast<double>(state_.epoch_samples);
    }
    if (val != nullptr) {
      event.val = evaluate(*val);
    }
    if (scheduler_ && !scheduler_per_step_) {
      if (scheduler_->takes_metric()) {
        scheduler_->step(event.val ? event.val->loss : event.train_loss);
      } else {
        scheduler_->step();
      }
    }
    ++state_.epoch;
    state_.batch = 0;
    state_.epoch_loss_sum = torch::zeros({}, torch::kFloat64);
    state_.epoch_samples = 0;
    for (auto& cb : callbacks_) {
      stop_ = cb->on_epoch_end(*this, event) || stop_;
    }
  }
  for (auto& cb : callbacks_) {
    cb->on_train_end(*this);
  }
}

void Trainer::save(torch::serialize::OutputArchive& archive) const {
  torch::serialize::OutputArchive model_archive;
  module_->save(model_archive);
  archive.write("model", model_archive);
  torch::serialize::OutputArchive optim_archive;
  optimizer_.save(optim_archive);
  archive.write("optimizer", optim_archive);
  if (scheduler_) {
    torch::serialize::OutputArchive sched_archive;
    scheduler_->save(sched_archive);
    archive.write("scheduler", sched_archive);
  }
  if (scaler_) {
    torch::serialize::OutputArchive scaler_archive;
    scaler_->save(scaler_archive);
    archive.write("grad_scaler", scaler_archive);
  }
  archive.write("trainer/epoch", torch::tensor(state_.epoch));
  archive.write("trainer/batch", torch::tensor(state_.batch));
  archive.write("trainer/step", torch::tensor(state_.step));
  archive.write("trainer/epoch_loss_sum", state_.epoch_loss_sum);
  archive.write("trainer/epoch_samples", torch::tensor(state_.epoch_samples));
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  archive.write("rng/cpu", gen.get_state());
}

void Trainer::load(torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive model_archive;
  archive.read("model", model_archive);
  module_->load(model_archive);
  torch::serialize::InputArchive optim_archive;
  archive.read("optimizer", optim_archive);
  optimizer_.load(optim_archive);
  if (scheduler_) {
    torch::serialize::InputArchive sched_archive;
    archive.read("scheduler", sched_archive);
    scheduler_->load(sched_archive);
  }
  if (scaler_) {
    torch::serialize::InputArchive scaler_archive;
    archive.read("grad_scaler", scaler_archive);
    scaler_->load(scaler_archive);
  }
  const auto read_int = [&archive](const char* key) {
    at::Tensor t;
    archive.read(key, t);
    return t.item<int64_t>();
  };
  state_.epoch = read_int("trainer/epoch");
  state_.batch = read_int("trainer/batch");
  state_.step = read_int("trainer/step");
  state_.epoch_samples = read_int("trainer/epoch_samples");
  archive.read("trainer/epoch_loss_sum", state_.epoch_loss_sum);
  at::Tensor rng;
  archive.read("rng/cpu", rng);
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
}

}  // namespace trainkit::train
