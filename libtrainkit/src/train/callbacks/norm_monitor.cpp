#include "trainkit/train/callbacks/norm_monitor.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/amp/grad_scaler.h"
#include "trainkit/train/trainer.h"
#include "detail/check.h"

namespace trainkit::train {

NormMonitor::NormMonitor(const torch::nn::Module& module, NormMonitorOptions options,
                       std::shared_ptr<log::SummaryWriter> tensorboard)
    : options_(std::move(options)), tensorboard_(std::move(tensorboard)) {
  TRAINKIT_CHECK_ARG(options_.every_steps() >= 1, "NormMonitor: invalid every_steps: {}", options_.every_steps());
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    params_.emplace_back(item.key(), item.value());
  }
  TRAINKIT_CHECK_ARG(!params_.empty(), "NormMonitor: the module has no parameters");
  if (!options_.csv_path().empty()) {
    const std::filesystem::path path(options_.csv_path());
    const bool fresh = !options_.append() || !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
    csv_.open(path, options_.append() ? std::ios::app : std::ios::trunc);
    if (!csv_) {
      throw std::runtime_error(fmt::format("{}: cannot open for writing", options_.csv_path()));
    }
    if (fresh) {
      csv_ << "step,name,grad_norm,param_norm\n";
    }
  }
}

void NormMonitor::on_before_optimizer_step(Trainer& trainer) {
  const int64_t step = trainer.state().step + 1;  // the step about to be taken
  if (step % options_.every_steps() != 0) {
    return;
  }
  torch::NoGradGuard no_grad;
  // Under a GradScaler the gradients are multiplied by the scale until unscale_() (which the Trainer calls
  // before clipping).
  double grad_factor = 1.0;
  const auto& scaler = trainer.grad_scaler();
  if (scaler && scaler->is_enabled() && scaler->stage(trainer.optimizer()) != amp::OptState::UNSCALED) {
    grad_factor = 1.0 / scaler->get_scale();
  }
  std::vector<at::Tensor> norms;
  norms.reserve(2 * params_.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [name, p] : params_) {
    const at::Tensor& g = p.grad();
    norms.push_back(g.defined() ? at::linalg_vector_norm(g, 2, c10::nullopt, false, torch::kFloat64).to(torch::kCPU)
                                : torch::full({}, nan, torch::kFloat64));
    norms.push_back(at::linalg_vector_norm(p, 2, c10::nullopt, false, torch::kFloat64).to(torch::kCPU));
  }
  const at::Tensor all = torch::stack(norms);  // one host read for all of them
  const auto values = all.accessor<double, 1>();
  last_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    last_.push_back(ParameterNorms{params_[i].first, values[static_cast<int64_t>(2 * i)] * grad_factor,
                              values[static_cast<int64_t>(2 * i + 1)]});
  }
  last_step_ = step;
  if (csv_.is_open()) {
    for (const ParameterNorms& n : last_) {
      csv_ << fmt::format("{},{},{:.9g},{:.9g}\n", step, n.name, n.grad_norm, n.param_norm);
    }
    csv_.flush();
  }
  if (tensorboard_) {
    for (const ParameterNorms& n : last_) {
      if (!std::isnan(n.grad_norm)) {
        tensorboard_->add_scalar("norms/grad/" + n.name, n.grad_norm, step);
      }
      tensorboard_->add_scalar("norms/param/" + n.name, n.param_norm, step);
    }
  }
}

}  // namespace trainkit::train
