#include "trainkit/train/trainer.h"

#include <algorithm>
#include <chrono>

#include <ATen/record_function.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "trainkit/amp/autocast.h"
#include "trainkit/compat.h"
#include "trainkit/grad/accumulation.h"
#include "trainkit/grad/clip.h"
#include "detail/check.h"
#include "detail/rng_state.h"

namespace trainkit::train {
namespace {

/// Module::load's walk (its own tensors, then each child's archive), copying every saved value into the
/// existing tensor instead of pointing the tensor at the loaded storage (`set_`), which replaces a
/// parameter's gradient accumulator: the hooks that DistributedDataParallel installed there before a resume
/// would never fire again, and every rank would train alone. Shapes and dtypes must match.
void load_in_place(torch::nn::Module& module, torch::serialize::InputArchive& archive, const std::string& prefix) {
  torch::NoGradGuard no_grad;
  const auto read = [&](const std::string& key, at::Tensor& target, bool is_buffer) {
    at::Tensor saved;
    archive.read(key, saved, is_buffer);
    if (!saved.sizes().equals(target.sizes()) || saved.scalar_type() != target.scalar_type()) {
      throw std::invalid_argument(c10::str(prefix, key, ": saved as ", saved.scalar_type(), " ", saved.sizes(),
                                           ", the model has ", target.scalar_type(), " ", target.sizes()));
    }
    target.copy_(saved);
  };
  for (auto& p : module.named_parameters(/*recurse=*/false)) {
    read(p.key(), p.value(), false);
  }
  for (auto& b : module.named_buffers(/*recurse=*/false)) {
    read(b.key(), b.value(), true);
  }
  for (const auto& child : module.named_children()) {
    torch::serialize::InputArchive child_archive;
    archive.read(child.key(), child_archive);
    load_in_place(*child.value(), child_archive, prefix + child.key() + ".");
  }
}

/// The device types whose generators checkpoints hold, with this process's device count: those of
/// detail::generator_device_types(), and CUDA always (with 0 devices here), so that a CPU machine writes
/// "rng/cuda_count" and warns when it resumes a GPU run.
std::vector<std::pair<c10::DeviceType, int64_t>> generator_types() {
  std::vector<std::pair<c10::DeviceType, int64_t>> types = trainkit::detail::generator_device_types();
  if (std::none_of(types.begin(), types.end(), [](const auto& t) { return t.first == c10::DeviceType::CUDA; })) {
    types.emplace(types.begin(), c10::DeviceType::CUDA, 0);
  }
  return types;
}

/// Charges wall time to StepTimes fields: lap(field) adds the time since the last lap (or restart) to it.
/// Reads no clock when disabled.
class PhaseTimer {
 public:
  explicit PhaseTimer(bool enabled) : enabled_(enabled) { restart(); }
  void restart() {
    if (enabled_) {
      mark_ = Clock::now();
    }
  }
  void lap(double& field) {
    if (enabled_) {
      const auto now = Clock::now();
      field += std::chrono::duration<double>(now - mark_).count();
      mark_ = now;
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  Clock::time_point mark_;
};

}  // namespace

Trainer::Trainer(std::shared_ptr<torch::nn::Module> module, ForwardFn forward,
                 torch::optim::Optimizer& optimizer, TrainerOptions options)
    : module_(std::move(module)),
      forward_(std::move(forward)),
      optimizer_(optimizer),
      options_(options),
      loss_(cross_entropy_loss()),
      metrics_{accuracy()} {
  TRAINKIT_CHECK_ARG(module_ != nullptr, "Trainer: module must not be null");
  TRAINKIT_CHECK_ARG(static_cast<bool>(forward_), "Trainer: the forward function must not be empty");
  check_options(TrainerOptions::binding(), options_, "Trainer");
  state_.epoch_loss_sum = torch::zeros({}, torch::kFloat64);
}

void Trainer::set_loss(LossFn loss) {
  TRAINKIT_CHECK_ARG(static_cast<bool>(loss), "Trainer::set_loss: the loss function must not be empty");
  loss_ = std::move(loss);
  if (!metrics_set_) {
    metrics_.clear();
  }
}

void Trainer::set_metrics(std::vector<std::shared_ptr<Metric>> metrics) {
  for (size_t i = 0; i < metrics.size(); ++i) {
    TRAINKIT_CHECK_ARG(metrics[i] != nullptr, "Trainer::set_metrics: metric {} is null", i);
    for (size_t j = 0; j < i; ++j) {
      TRAINKIT_CHECK_ARG(metrics[j]->name() != metrics[i]->name(), "Trainer::set_metrics: two metrics named \"{}\"",
                         metrics[i]->name());
    }
    TRAINKIT_CHECK_ARG(metrics[i]->name() != "loss", "Trainer::set_metrics: \"loss\" is always reported; name the "
                                                     "metric differently");
  }
  metrics_ = std::move(metrics);
  metrics_set_ = true;
}

void Trainer::set_scheduler(std::shared_ptr<sched::LRScheduler> scheduler, bool per_step, std::string monitor) {
  TRAINKIT_CHECK_ARG(scheduler != nullptr, "Trainer::set_scheduler: scheduler must not be null");
  TRAINKIT_CHECK_ARG(!(per_step && scheduler->takes_metric()),
                     "Trainer::set_scheduler: {} steps with a metric once per epoch, not per step", scheduler->name());
  TRAINKIT_CHECK_ARG(&scheduler->optimizer() == &optimizer_, "Trainer::set_scheduler: {} drives a different optimizer",
                     scheduler->name());
  TRAINKIT_CHECK_ARG(monitor.rfind("val/", 0) == 0 || monitor.rfind("train/", 0) == 0,
                     "Trainer::set_scheduler: invalid monitor \"{}\" (\"val/<metric>\" or \"train/loss\")", monitor);
  scheduler_ = std::move(scheduler);
  scheduler_per_step_ = per_step;
  monitor_ = std::move(monitor);
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
  const at::Tensor loss = loss_(forward_(batch), batch);
  // Under autocast a half or bfloat16 loss is reported and backpropagated from float32.
  return autocast_ ? amp::loss_for_backward(loss) : loss;
}

void Trainer::sync_for_profile(const c10::Device& device) const {
  if (options_.profile_sync() && device.type() != c10::DeviceType::CPU) {
    compat::synchronize_device(device);
  }
}

at::Tensor Trainer::backward(const data::Batch& batch, double loss_scale) {
  PhaseTimer timer(options_.profile());
  at::Tensor loss;
  {
    RECORD_USER_SCOPE("trainkit::forward");
    loss = forward_loss(batch);
    sync_for_profile(loss.device());
  }
  timer.lap(times_.forward);
  {
    RECORD_USER_SCOPE("trainkit::backward");
    at::Tensor to_backprop = loss_scale == 1.0 ? loss : loss * loss_scale;
    if (scaler_) {
      to_backprop = scaler_->scale(to_backprop);
    }
    to_backprop.backward();
    sync_for_profile(loss.device());
  }
  timer.lap(times_.backward);
  ++times_.micro_batches;
  return loss.detach();
}

void Trainer::optimizer_step() {
  const bool clipping = options_.clip_grad_value() > 0 || options_.clip_grad_norm() > 0;
  if (scaler_ && clipping) {
    scaler_->unscale_(optimizer_);  // clip the true gradients
  }
  for (auto& cb : callbacks_) {
    cb->on_before_optimizer_step(*this);
  }
  if (options_.clip_grad_value() > 0) {
    grad::clip_grad_value_(optimizer_params(), options_.clip_grad_value());
  }
  if (options_.clip_grad_norm() > 0) {
    grad_norm_ = clip_grad_norm_fn_ ? clip_grad_norm_fn_(options_.clip_grad_norm(), options_.norm_type())
                                    : grad::clip_grad_norm_(optimizer_params(), options_.clip_grad_norm(),
                                                            options_.norm_type());
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

EvalResult Trainer::evaluate(data::BatchSource& source) {
  const bool was_training = module_->is_training();
  module_->eval();
  torch::NoGradGuard no_grad;
  for (auto& m : metrics_) {
    m->reset();
  }
  // The loss sum stays where the losses are: one copy to the host at the end, not one per batch.
  at::Tensor loss_sum;
  int64_t samples = 0;
  const LossFn& loss = eval_loss_ ? eval_loss_ : loss_;
  source.set_epoch(0);
  while (auto b = source.next()) {
    const auto guard = autocast_region();
    const at::Tensor out = forward_(*b);
    const int64_t n = b->size();
    const at::Tensor weighted = loss(out, *b).detach().to(torch::kFloat64) * static_cast<double>(n);
    loss_sum = loss_sum.defined() ? loss_sum + weighted : weighted;
    for (auto& m : metrics_) {
      m->update(out, *b);
    }
    samples += n;
  }
  module_->train(was_training);
  if (!loss_sum.defined()) {
    loss_sum = torch::zeros({}, torch::kFloat64);
  }
  if (reducer_) {
    // One tensor on the losses' device: the reducer sums it over the ranks in one collective.
    const auto on_device = torch::TensorOptions().dtype(torch::kFloat64).device(loss_sum.device());
    std::vector<at::Tensor> parts{loss_sum.reshape({1}), torch::full({1}, static_cast<double>(samples), on_device)};
    for (const auto& m : metrics_) {
      parts.push_back(m->state().to(on_device).reshape({-1}));
    }
    at::Tensor all = torch::cat(parts);
    reducer_(all);
    loss_sum = all[0];
    samples = static_cast<int64_t>(all[1].item<double>());
    int64_t offset = 2;
    for (auto& m : metrics_) {
      const int64_t len = m->state().numel();
      m->set_state(all.narrow(0, offset, len));
      offset += len;
    }
  }
  TRAINKIT_CHECK_ARG(samples > 0, "Trainer::evaluate: the evaluation source yielded no batch");
  EvalResult r;
  r.samples = samples;
  r.loss = loss_sum.item<double>() / static_cast<double>(samples);
  for (const auto& m : metrics_) {
    r.metrics.set(m->name(), m->compute());
  }
  return r;
}

void Trainer::fit(data::BatchSource& train, data::BatchSource* val) {
  stop_ = false;
  module_->train();
  for (auto& cb : callbacks_) {
    cb->on_train_begin(*this);
  }
  const auto reached_max = [this] { return options_.max_steps() > 0 && state_.step >= options_.max_steps(); };
  const bool mid_epoch_validation = options_.val_every_steps() > 0 || options_.val_fraction() < 1.0;
  TRAINKIT_CHECK_ARG(!mid_epoch_validation || val != nullptr,
                     "Trainer::fit: val_every_steps = {} / val_fraction = {} validate mid-epoch and need a validation "
                     "source", options_.val_every_steps(), options_.val_fraction());
  stop_ = stop_ || reached_max();
  optimizer_.zero_grad();
  PhaseTimer timer(options_.profile());
  const auto next_batch = [&train, &timer, this] {
    RECORD_USER_SCOPE("trainkit::data");
    timer.restart();
    std::optional<data::Batch> b = train.next();
    timer.lap(times_.data);
    return b;
  };
  while (state_.epoch < options_.epochs() && !stop_) {
    times_ = StepTimes{};
    PhaseTimer epoch_timer(options_.profile());
    train.set_epoch(state_.epoch);
    if (state_.batch > 0) {
      train.skip(state_.batch);
    }
    const int64_t num_batches = train.num_batches();
    const bool known_length = num_batches != data::BatchSource::kUnknownLength;
    TRAINKIT_CHECK_ARG(known_length || options_.val_fraction() == 1.0,
                       "Trainer::fit: val_fraction = {} needs the epoch's length, which the training source cannot tell; "
                       "use val_every_steps", options_.val_fraction());
    grad::GradAccumulation accumulation(options_.accumulation_steps(), known_length ? num_batches : 0);
    accumulation.seek(known_length ? std::min(state_.batch, std::max<int64_t>(num_batches - 1, 0)) : state_.batch);
    std::optional<data::Batch> next = next_batch();
    TRAINKIT_CHECK_ARG(next.has_value() || state_.batch > 0,
                       "Trainer::fit: the training source yielded no batch in epoch {}", state_.epoch);
    // Loss sums stay on the losses' device between the points that read them (a copy to the host per
    // micro-batch would wait for the device every time).
    at::Tensor window_loss;
    int64_t window_samples = 0;
    while (next && !stop_) {
      const data::Batch batch = std::move(*next);
      next = next_batch();  // one batch ahead: the epoch's end is known before the backward
      const bool last = !next.has_value();
      const bool step_now = accumulation.sync_now() || last;
      at::Tensor loss;
      if (!step_now && no_sync_) {
        // Not the window's last micro-batch: gradients only accumulate locally (e.g. DDP's no_sync).
        const std::shared_ptr<void> guard = no_sync_();
        loss = backward(batch, accumulation.loss_scale());
      } else {
        loss = backward(batch, accumulation.loss_scale());
      }
      const int64_t n = batch.size();
      const at::Tensor weighted = loss.to(torch::kFloat64) * static_cast<double>(n);
      if (state_.epoch_loss_sum.device() != weighted.device()) {
        state_.epoch_loss_sum = state_.epoch_loss_sum.to(weighted.device());  // once: a new run or a resume
      }
      state_.epoch_loss_sum += weighted;
      state_.epoch_samples += n;
      window_loss = window_loss.defined() ? window_loss + weighted : weighted;
      window_samples += n;
      accumulation.next();
      ++state_.batch;
      if (!step_now) {
        continue;
      }
      timer.restart();
      {
        RECORD_USER_SCOPE("trainkit::optimizer");
        optimizer_step();
        if (scheduler_ && scheduler_per_step_) {
          scheduler_->step();
        }
        sync_for_profile(loss.device());
      }
      timer.lap(times_.optimizer);
      ++times_.steps;
      ++state_.step;
      const StepEvent event{state_.epoch, state_.batch - 1, num_batches, last, state_.step, window_samples,
                            window_loss / static_cast<double>(window_samples)};
      window_loss = at::Tensor();
      window_samples = 0;
      if (mid_epoch_validation && !last && validation_due(num_batches)) {
        // Before the step hooks, so that a checkpoint written at this step holds what the validation changed.
        RECORD_USER_SCOPE("trainkit::validation");
        EpochEvent point{state_.epoch, state_.step, state_.epoch_loss_sum.item<double>() / static_cast<double>(state_.epoch_samples),
                         std::nullopt, {}, times_, false};
        stop_ = validation_point(val, point) || stop_;
        timer.lap(times_.validation);
      }
      {
        RECORD_USER_SCOPE("trainkit::callbacks");
        for (auto& cb : callbacks_) {
          stop_ = cb->on_step_end(*this, event) || stop_;
        }
      }
      timer.lap(times_.callbacks);
      stop_ = stop_ || reached_max();
    }
    epoch_timer.lap(times_.total);
    if (next) {
      break;  // stopped mid-epoch
    }
    EpochEvent event{state_.epoch, state_.step, 0.0, std::nullopt, {}, {}};
    if (state_.epoch_samples > 0) {
      event.train_loss = state_.epoch_loss_sum.item<double>() / static_cast<double>(state_.epoch_samples);
    }
    stop_ = validation_point(val, event) || stop_;
    epoch_timer.lap(times_.validation);
    event.times = times_;
    if (scheduler_ && !scheduler_per_step_ && !scheduler_->takes_metric()) {
      scheduler_->step();
    }
    ++state_.epoch;
    state_.batch = 0;
    state_.epoch_loss_sum = torch::zeros({}, state_.epoch_loss_sum.options());
    state_.epoch_samples = 0;
    for (auto& cb : callbacks_) {
      stop_ = cb->on_epoch_end(*this, event) || stop_;
    }
  }
  for (auto& cb : callbacks_) {
    cb->on_train_end(*this);
  }
}

bool Trainer::validation_due(int64_t num_batches) const {
  if (options_.val_every_steps() > 0 && state_.step % options_.val_every_steps() == 0) {
    return true;
  }
  if (options_.val_fraction() < 1.0) {
    // Lightning's rule: every int(steps per epoch x fraction) steps of the epoch, counted from its start.
    const int64_t accumulation = options_.accumulation_steps();
    const int64_t steps_per_epoch = (num_batches + accumulation - 1) / accumulation;
    const auto every =
        std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(steps_per_epoch) * options_.val_fraction()));
    const int64_t step_in_epoch = (state_.batch + accumulation - 1) / accumulation;
    return step_in_epoch % every == 0;
  }
  return false;
}

bool Trainer::validation_point(data::BatchSource* val, EpochEvent& event) {
  event.metrics.set("train/loss", event.train_loss);
  if (val != nullptr) {
    event.val = evaluate(*val);
    event.metrics.set("val/loss", event.val->loss);
    for (const auto& [name, value] : event.val->metrics.items()) {
      event.metrics.set("val/" + name, value);
    }
  }
  for (auto& cb : callbacks_) {
    cb->on_validation_end(*this, val, event);
  }
  if (scheduler_ && !scheduler_per_step_ && scheduler_->takes_metric()) {
    std::optional<double> value = event.metrics.find(monitor_);
    if (!value && monitor_ == "val/loss") {
      value = event.train_loss;
    }
    if (!value) {
      throw std::invalid_argument(fmt::format(
          "Trainer: {} monitors \"{}\", which epoch {} did not measure (a validation source and that metric are needed)",
          scheduler_->name(), monitor_, state_.epoch));
    }
    scheduler_->step(*value);
  }
  bool stop = false;
  for (auto& cb : callbacks_) {
    stop = cb->on_validation_point(*this, event) || stop;
  }
  return stop;
}

void Trainer::save(torch::serialize::OutputArchive& archive) const {
  torch::serialize::OutputArchive model_archive;
  if (save_model_) {
    save_model_(model_archive);
  } else {
    module_->save(model_archive);
  }
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
  archive.write("trainer/epoch_loss_sum", state_.epoch_loss_sum.cpu());  // a checkpoint loads on any device
  archive.write("trainer/epoch_samples", torch::tensor(state_.epoch_samples));
  for (const auto& cb : callbacks_) {
    const std::string key = cb->state_key();
    if (!key.empty()) {
      torch::serialize::OutputArchive cb_archive;
      cb->save(cb_archive);
      archive.write("callbacks/" + key, cb_archive);
    }
  }
  archive.write("rng/cpu", trainkit::detail::rng_state(c10::Device(c10::kCPU)));
  // Every device's generator (torch.cuda.get_rng_state_all for CUDA; likewise another accelerator's):
  // dropout and augmentation drawn on a device resume where they were. "rng/<type>_count", "rng/<type>/<i>".
  for (const auto& [type, count] : generator_types()) {
    const std::string name = c10::DeviceTypeName(type, /*lower_case=*/true);
    archive.write(fmt::format("rng/{}_count", name), torch::tensor(count));
    for (int64_t i = 0; i < count; ++i) {
      archive.write(fmt::format("rng/{}/{}", name, i),
                    trainkit::detail::rng_state(c10::Device(type, static_cast<c10::DeviceIndex>(i))));
    }
  }
}

void Trainer::load(torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive model_archive;
  archive.read("model", model_archive);
  if (load_model_) {
    load_model_(model_archive);
  } else {
    load_in_place(*module_, model_archive, "");
  }
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
  for (auto& cb : callbacks_) {
    const std::string key = cb->state_key();
    if (!key.empty()) {
      torch::serialize::InputArchive cb_archive;
      if (!archive.try_read("callbacks/" + key, cb_archive)) {
        throw std::invalid_argument(fmt::format(
            "Trainer::load: the checkpoint has no state of the \"{}\" hook (was it saved without it?)", key));
      }
      cb->load(cb_archive);
    }
  }
  at::Tensor rng;
  archive.read("rng/cpu", rng);
  trainkit::detail::set_rng_state(c10::Device(c10::kCPU), rng);
  // Device generators: as many of each type as both the checkpoint and this process have (a checkpoint
  // written before device states were saved has none); one warning when the counts differ, since that
  // device's random streams then differ from the saved run's (a CPU run resumed on a GPU, or the reverse).
  for (const auto& [type, here] : generator_types()) {
    const std::string name = c10::DeviceTypeName(type, /*lower_case=*/true);
    at::Tensor count;
    const int64_t saved = archive.try_read(fmt::format("rng/{}_count", name), count) ? count.item<int64_t>() : 0;
    for (int64_t i = 0; i < std::min(saved, here); ++i) {
      at::Tensor state;
      archive.read(fmt::format("rng/{}/{}", name, i), state);
      trainkit::detail::set_rng_state(c10::Device(type, static_cast<c10::DeviceIndex>(i)), state);
    }
    if (saved != here) {
      spdlog::warn("Trainer::load: the checkpoint holds the random state of {} {} device{}, this process has {}: {} "
                   "restored; random numbers drawn on {} devices (dropout, augmentation there) differ from the saved "
                   "run's from here on", saved, c10::DeviceTypeName(type), saved == 1 ? "" : "s", here,
                   std::min(saved, here), c10::DeviceTypeName(type));
    }
  }
}

}  // namespace trainkit::train
