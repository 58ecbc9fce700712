#pragma once
// What a tuning run (LR range test, batch-size search) changes, captured before and put back after:
// parameters and buffers, the optimizer state (LRs included), every device's default generator (the CPU's,
// each CUDA device's, each device of another accelerator: dropout and augmentation on a GPU draw there), the
// train/eval mode and, when given, a GradScaler's state.

#include <mutex>
#include <sstream>

#include <torch/torch.h>

#include "trainkit/amp/grad_scaler.h"
#include "detail/rng_state.h"

namespace trainkit::tune::detail {

class Snapshot {
 public:
  Snapshot(torch::nn::Module& module, torch::optim::Optimizer& optimizer, amp::GradScaler* scaler = nullptr)
      : module_(module), optimizer_(optimizer), scaler_(scaler) {
    torch::serialize::OutputArchive m;
    module_.save(m);
    m.save_to(model_bytes_);
    torch::serialize::OutputArchive o;
    optimizer_.save(o);
    o.save_to(optim_bytes_);
    rng_ = trainkit::detail::all_rng_states();
    training_ = module_.is_training();
    if (scaler_ != nullptr) {
      torch::serialize::OutputArchive a;
      scaler_->save(a);
      a.save_to(scaler_bytes_);
    }
  }

  void restore() {
    model_bytes_.clear();
    model_bytes_.seekg(0);
    torch::serialize::InputArchive m;
    m.load_from(model_bytes_);
    module_.load(m);
    // A fresh optimizer state first: load() only overwrites entries present in the archive, and the
    // run may have created state the archive does not have.
    optimizer_.state().clear();
    optim_bytes_.clear();
    optim_bytes_.seekg(0);
    torch::serialize::InputArchive o;
    o.load_from(optim_bytes_);
    optimizer_.load(o);
    trainkit::detail::set_all_rng_states(rng_);
    module_.train(training_);
    if (scaler_ != nullptr) {
      // An iteration an exception interrupted is ended first (keeping the scale), so that the scaler
      // accepts the optimizer again.
      if (scaler_->stage(optimizer_) != amp::OptState::READY) {
        scaler_->update(scaler_->get_scale());
      }
      scaler_bytes_.clear();
      scaler_bytes_.seekg(0);
      torch::serialize::InputArchive a;
      a.load_from(scaler_bytes_);
      scaler_->load(a);
    }
  }

 private:
  torch::nn::Module& module_;
  torch::optim::Optimizer& optimizer_;
  amp::GradScaler* scaler_;
  std::stringstream model_bytes_;
  std::stringstream optim_bytes_;
  std::stringstream scaler_bytes_;
  std::vector<std::pair<c10::Device, at::Tensor>> rng_;
  bool training_ = true;
};

}  // namespace trainkit::tune::detail
