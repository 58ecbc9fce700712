#include "trainkit/dist/pipeline.h"

#include <future>
#include <optional>
#include <thread>

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::dist {

Pipeline::Pipeline(std::vector<torch::nn::Sequential> stages, std::vector<c10::Device> devices, PipelineOptions options)
    : stages_(std::move(stages)), devices_(std::move(devices)), options_(options) {
  TRAINKIT_CHECK_ARG(!stages_.empty(), "Pipeline: no stages");
  TRAINKIT_CHECK_ARG(stages_.size() == devices_.size(), "Pipeline: {} stages but {} devices", stages_.size(),
                     devices_.size());
  TRAINKIT_CHECK_ARG(options_.chunks() >= 1, "Pipeline: invalid chunks: {}", options_.chunks());
  for (size_t s = 0; s < stages_.size(); ++s) {
    TRAINKIT_CHECK_ARG(stages_[s], "Pipeline: stage {} is null", s);
    auto& device = devices_[s];
    if (!device.is_cpu() && !device.has_index()) {
      // "cuda" is the current device now, fixed once: a stage thread's own current device starts at 0.
      device = c10::Device(device.type(), c10::impl::getDeviceGuardImpl(device.type())->getDevice().index());
    }
    stages_[s]->to(device);
  }
}

at::Tensor Pipeline::forward(const at::Tensor& input) {
  const auto chunks = input.split(std::max<int64_t>(1, (input.size(0) + options_.chunks() - 1) / options_.chunks()));
  const size_t n_stages = stages_.size();
  const size_t n_chunks = chunks.size();
  // outputs[s][i]: stage s's output for micro-batch i, handed to stage s+1's thread.
  std::vector<std::vector<std::promise<at::Tensor>>> promises(n_stages);
  std::vector<std::vector<std::shared_future<at::Tensor>>> outputs(n_stages);
  for (size_t s = 0; s < n_stages; ++s) {
    promises[s].resize(n_chunks);
    for (auto& p : promises[s]) outputs[s].push_back(p.get_future().share());
  }
  const bool grad_mode = at::GradMode::is_enabled();  // thread-local: carried into the stage threads
  // The current device and stream are thread-local too: each stage thread makes its stage's device current
  // (its kernels, allocations and copies then go there, not to device 0) and uses the stream the caller has
  // current on that device, so that the stage's work is ordered after the caller's.
  std::vector<std::optional<c10::Stream>> streams(n_stages);
  for (size_t s = 0; s < n_stages; ++s) {
    if (!devices_[s].is_cpu()) streams[s] = c10::impl::getDeviceGuardImpl(devices_[s].type())->getStream(devices_[s]);
  }
  std::vector<std::thread> threads;
  for (size_t s = 0; s < n_stages; ++s) {
    threads.emplace_back([&, s] {
      c10::OptionalDeviceGuard device_guard;
      c10::OptionalStreamGuard stream_guard;
      if (streams[s]) {
        device_guard.reset_device(devices_[s]);
        stream_guard.reset_stream(*streams[s]);
      }
      at::AutoGradMode mode(grad_mode);
      for (size_t i = 0; i < n_chunks; ++i) {
        try {
          at::Tensor x = s == 0 ? chunks[i] : outputs[s - 1][i].get();
          promises[s][i].set_value(stages_[s]->forward(x.to(devices_[s])));
        } catch (...) {
          // This and every later micro-batch fail; the next stage rethrows from get().
          for (size_t j = i; j < n_chunks; ++j) promises[s][j].set_exception(std::current_exception());
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<at::Tensor> out;
  for (auto& f : outputs.back()) out.push_back(f.get());
  return torch::cat(out);
}

std::vector<at::Tensor> Pipeline::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& s : stages_) {
    for (const auto& p : s->parameters()) out.push_back(p);
  }
  return out;
}

void Pipeline::train(bool on) {
  for (auto& s : stages_) s->train(on);
}

}  // namespace trainkit::dist
