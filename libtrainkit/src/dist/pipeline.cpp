#include "trainkit/dist/pipeline.h"

#include <future>
#include <thread>

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
    stages_[s]->to(devices_[s]);
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
  std::vector<std::thread> threads;
  for (size_t s = 0; s < n_stages; ++s) {
    threads.emplace_back([&, s] {
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
