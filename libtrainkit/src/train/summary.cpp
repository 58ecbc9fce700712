#include "trainkit/train/summary.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace trainkit::train {

namespace {

void count(const torch::nn::Module& m, int64_t& params, int64_t& trainable) {
  for (const auto& p : m.parameters()) {
    params += p.numel();
    if (p.requires_grad()) {
      trainable += p.numel();
    }
  }
}

std::string human_bytes(int64_t bytes) {
  if (bytes < 1024) {
    return fmt::format("{} B", bytes);
  }
  if (bytes < 1024 * 1024) {
    return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024.0);
  }
  return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

}  // namespace

ModelSummary summary(const torch::nn::Module& module) {
  ModelSummary s;
  for (const auto& item : module.named_children()) {
    LayerSummary row;
    row.name = item.key();
    row.type = item.value()->name();
    if (row.type.size() > 4 && row.type.compare(row.type.size() - 4, 4, "Impl") == 0) {
      row.type.resize(row.type.size() - 4);  // torch::nn::Conv2dImpl → torch::nn::Conv2d, as users spell it
    }
    count(*item.value(), row.params, row.trainable_params);
    s.layers.push_back(row);
  }
  count(module, s.params, s.trainable_params);
  for (const auto& p : module.parameters()) {
    s.param_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  for (const auto& b : module.buffers()) {
    s.buffer_bytes += b.numel() * static_cast<int64_t>(b.element_size());
  }
  return s;
}

ModelSummary summary(torch::nn::Sequential& model, const at::Tensor& example) {
  ModelSummary s = summary(*model);
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  at::Tensor x = example;
  size_t i = 0;
  for (auto& child : *model) {
    x = child.forward(x);
    if (i < s.layers.size()) {
      s.layers[i].output_shape = x.sizes().vec();
    }
    ++i;
  }
  model->train(was_training);
  return s;
}

std::string ModelSummary::to_string() const {
  size_t name_width = 5;
  size_t type_width = 4;
  for (const auto& l : layers) {
    name_width = std::max(name_width, l.name.size());
    type_width = std::max(type_width, l.type.size());
  }
  std::string out =
      fmt::format("  {:<{}} {:<{}} {:<20} {:>12}\n", "", name_width, "Type", type_width, "Output shape", "Params");
  for (const auto& l : layers) {
    const std::string shape = l.output_shape.empty() ? "-" : fmt::format("[{}]", fmt::join(l.output_shape, ", "));
    out += fmt::format("  {:<{}} {:<{}} {:<20} {:>12}\n", l.name, name_width, l.type, type_width, shape, l.params);
  }
  out += fmt::format("  {} trainable parameters, {} non-trainable, {} total\n", trainable_params,
                     params - trainable_params, params);
  out += fmt::format("  size: {} of parameters + {} of buffers", human_bytes(param_bytes), human_bytes(buffer_bytes));
  return out;
}

}  // namespace trainkit::train
