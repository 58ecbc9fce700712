#include "trainkit/train/callbacks/stochastic_weight_averaging.h"

#include <torch/torch.h>

#include "trainkit/train/trainer.h"
#include "detail/check.h"

namespace trainkit::train {

StochasticWeightAveraging::StochasticWeightAveraging(const torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                                     StochasticWeightAveragingOptions options)
    : optimizer_(optimizer), options_(std::move(options)), averaged_(model) {
  TRAINKIT_CHECK_ARG(options_.swa_start() >= 0, "StochasticWeightAveraging: invalid swa_start: {}",
                     options_.swa_start());
  TRAINKIT_CHECK_ARG(options_.swa_lr() >= 0, "StochasticWeightAveraging: invalid swa_lr: {}", options_.swa_lr());
  TRAINKIT_CHECK_ARG(options_.anneal_epochs() >= 0, "StochasticWeightAveraging: invalid anneal_epochs: {}",
                     options_.anneal_epochs());
  TRAINKIT_CHECK_ARG(options_.anneal_strategy() == "cos" || options_.anneal_strategy() == "linear",
                     "StochasticWeightAveraging: anneal_strategy must be \"cos\" or \"linear\", got \"{}\"",
                     options_.anneal_strategy());
}

void StochasticWeightAveraging::apply_swa_lr() {
  if (!swalr_) {
    return;
  }
  const auto& lrs = swalr_->get_last_lr();
  for (size_t i = 0; i < lrs.size(); ++i) {
    optimizer_.param_groups()[i].options().set_lr(lrs[i]);
  }
}

bool StochasticWeightAveraging::on_step_end(Trainer&, const StepEvent&) {
  apply_swa_lr();
  return false;
}

void StochasticWeightAveraging::on_validation_end(Trainer& trainer, data::BatchSource*, EpochEvent& event) {
  if (!event.epoch_end || event.epoch < options_.swa_start()) {  // averages once per epoch
    return;
  }
  averaged_.update_parameters(trainer.module());
  if (options_.swa_lr() > 0) {
    if (!swalr_) {
      swalr_ = std::make_unique<SWALR>(optimizer_, SWALROptions(options_.swa_lr())
                                                       .anneal_epochs(options_.anneal_epochs())
                                                       .anneal_strategy(options_.anneal_strategy()));
    }
    apply_swa_lr();
    swalr_->step();
  }
}

bool StochasticWeightAveraging::on_epoch_end(Trainer&, const EpochEvent&) {
  apply_swa_lr();
  return false;
}

void StochasticWeightAveraging::save(torch::serialize::OutputArchive& archive) const {
  torch::serialize::OutputArchive avg;
  averaged_.save(avg);
  archive.write("averaged", avg);
  archive.write("has_scheduler", torch::tensor(static_cast<int64_t>(swalr_ != nullptr)));
  if (swalr_) {
    torch::serialize::OutputArchive s;
    swalr_->save(s);
    archive.write("scheduler", s);
  }
}

void StochasticWeightAveraging::load(torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive avg;
  archive.read("averaged", avg);
  averaged_.load(avg);
  at::Tensor has;
  archive.read("has_scheduler", has);
  swalr_.reset();
  if (has.item<int64_t>() != 0) {
    swalr_ = std::make_unique<SWALR>(optimizer_, SWALROptions(options_.swa_lr())
                                                     .anneal_epochs(options_.anneal_epochs())
                                                     .anneal_strategy(options_.anneal_strategy()));
    torch::serialize::InputArchive s;
    archive.read("scheduler", s);
    swalr_->load(s);
  }
}

}  // namespace trainkit::train
