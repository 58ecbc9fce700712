#pragma once
/// @file
/// A TorchScript model (written with `torch.jit.script`/`trace` and `torch.jit.save` in Python) as a
/// `torch::nn::Module`, so that the Trainer, both finders, EMA, SWA, checkpoints and DDP train it like any
/// module:
///
///   auto model = trainkit::nn::ScriptModule(torch::jit::load("model.pt"));
///   trainkit::train::Trainer trainer(model.ptr(), trainkit::nn::script_forward(model), optimizer);
///   ...
///   model->save("trained.pt");  // torch.jit.load in Python gives the same outputs
///
/// Parameters and buffers are registered under the script module's names (submodules as child modules),
/// sharing their tensors: an optimizer's updates, `to(device)` and a loaded checkpoint reach the script
/// module. `train()`/`eval()` set the script module's mode too. `trainkit train` trains one with
/// `model.name = "torchscript"` and `model.torchscript = "path.pt"`.

#include <string>
#include <vector>

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace trainkit::nn {

/// A torch::jit::Module seen as a torch::nn::Module (see the file comment).
class ScriptModuleImpl : public torch::nn::Module {
 public:
  /// Wraps `module` (its tensors are shared, not copied).
  explicit ScriptModuleImpl(torch::jit::Module module);
  /// Loads a torch.jit.save file; throws std::runtime_error naming `path` when it cannot be read.
  static std::shared_ptr<ScriptModuleImpl> load(const std::string& path);

  /// The script module's `forward` on `inputs` (positional), as a tensor; throws std::runtime_error when
  /// it returns something else.
  at::Tensor forward(const std::vector<at::Tensor>& inputs);
  /// Sets this module's and the script module's training mode.
  void train(bool on = true) override;
  /// Writes the script module (with the current weights) as a torch.jit.save file, atomically.
  void save(const std::string& path) const;
  /// torch::nn::Module's archive form stays callable (it writes the parameters and buffers).
  using torch::nn::Module::save;
  /// The wrapped module.
  torch::jit::Module& script() { return module_; }

 private:
  torch::jit::Module module_;
};
TORCH_MODULE(ScriptModule);

}  // namespace trainkit::nn
