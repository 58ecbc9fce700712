#pragma once
/// @file
/// Model parallelism with micro-batch pipelining in the style of GPipe (Huang et al. 2019, arXiv
/// 1811.06965): a model split into sequential stages, each on its own device (`cuda:0`, `cuda:1`, ... or
/// CPU stages); the batch is split into `chunks` micro-batches and stage s works on micro-batch i while
/// stage s+1 works on micro-batch i-1 (one thread per stage, running under a guard that makes its stage's
/// device current, with the stream the caller has current on that device). The outputs are concatenated on the last
/// stage's device, so one loss and one backward() train all stages; the result equals the unsplit model's
/// on the whole batch (for layers that do not mix samples: no batch norm).
///
///     trainkit::dist::Pipeline pipe({stage0, stage1}, {torch::kCUDA, torch::Device("cuda:1")},
///                                   trainkit::dist::PipelineOptions().chunks(4));
///     auto loss = torch::nn::functional::cross_entropy(pipe.forward(x), y.to(pipe.output_device()));
///     loss.backward();  // autograd runs each stage's backward on its device

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

namespace trainkit::dist {

/// Options of Pipeline.
struct PipelineOptions {
  /// Micro-batches per batch (GPipe's `chunks`); a batch smaller than this uses one row per chunk.
  TORCH_ARG(int64_t, chunks) = 4;
};

/// Sequential stages on devices with GPipe-style micro-batch pipelining of the forward pass.
class Pipeline {
 public:
  /// Moves stage s to devices[s] (a device type without index, e.g. kCUDA, means the current device of that
  /// type now). Needs as many devices as stages (>= 1).
  Pipeline(std::vector<torch::nn::Sequential> stages, std::vector<c10::Device> devices, PipelineOptions options = {});
  /// Runs `input` (any device) through all stages in micro-batches; returns the output on output_device().
  at::Tensor forward(const at::Tensor& input);
  /// All stages' parameters, stage by stage.
  std::vector<at::Tensor> parameters() const;
  /// Device of the last stage, where forward()'s output lives.
  c10::Device output_device() const { return devices_.back(); }
  /// The stages.
  const std::vector<torch::nn::Sequential>& stages() const { return stages_; }
  /// Switches every stage to training or evaluation mode.
  void train(bool on = true);

 private:
  std::vector<torch::nn::Sequential> stages_;
  std::vector<c10::Device> devices_;
  PipelineOptions options_;
};

}  // namespace trainkit::dist
