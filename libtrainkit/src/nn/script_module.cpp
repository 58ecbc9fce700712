#include "trainkit/nn/script_module.h"

#include <stdexcept>

#include <fmt/format.h>
#include <torch/script.h>

#include "detail/atomic_file.h"

namespace trainkit::nn {

ScriptModuleImpl::ScriptModuleImpl(torch::jit::Module module) : module_(std::move(module)) {
  for (const auto& p : module_.named_parameters(/*recurse=*/false)) {
    register_parameter(p.name, p.value, p.value.requires_grad());
  }
  for (const auto& b : module_.named_buffers(/*recurse=*/false)) {
    register_buffer(b.name, b.value);
  }
  for (const auto& child : module_.named_children()) {
    register_module(child.name, std::make_shared<ScriptModuleImpl>(child.value));
  }
  torch::nn::Module::train(module_.is_training());
}

std::shared_ptr<ScriptModuleImpl> ScriptModuleImpl::load(const std::string& path) {
  try {
    return std::make_shared<ScriptModuleImpl>(torch::jit::load(path));
  } catch (const c10::Error& e) {
    throw std::runtime_error(fmt::format("{}: not a TorchScript file that torch::jit::load reads: {}", path,
                                         e.what_without_backtrace()));
  }
}

at::Tensor ScriptModuleImpl::forward(const std::vector<at::Tensor>& inputs) {
  const c10::IValue out = module_.forward(std::vector<c10::IValue>(inputs.begin(), inputs.end()));
  if (!out.isTensor()) {
    throw std::runtime_error(fmt::format("TorchScript forward returned {}, not a tensor", out.tagKind()));
  }
  return out.toTensor();
}

void ScriptModuleImpl::train(bool on) {
  torch::nn::Module::train(on);
  module_.train(on);
}

void ScriptModuleImpl::save(const std::string& path) const {
  try {
    detail::write_file_atomic(path, [this](std::ostream& out) { module_.save(out); });
  } catch (const detail::AtomicWriteError& e) {
    throw std::runtime_error(e.what());
  }
}

}  // namespace trainkit::nn
