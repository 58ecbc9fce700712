#pragma once
/// @file
/// Interchange copies of a module's weights that Python reads, by format name: what `trainkit train`'s
/// `checkpoint.export` and ModelCheckpoint's export_formats write.
///
///     trainkit::io::export_weights(*net, "run", "model", {"safetensors", "state_dict"});
///     // run/model.safetensors (safetensors.torch.load_file) and run/model.pth (torch.load, weights_only=True)

#include <string>
#include <vector>

#include <torch/nn/module.h>

namespace trainkit::io {

/// The export format names: "safetensors" (<stem>.safetensors, metadata format = pt), "state_dict"
/// (<stem>.pth, a torch.save state_dict) and "torchscript" (<stem>.torchscript.pt, torch.jit.save of an
/// nn::ScriptModule with its current weights: a whole model Python's torch.jit.load runs).
const std::vector<std::string>& export_formats();

/// Writes `module`'s state_dict as `dir`/<stem>.<extension> in each of `formats` (each file atomically).
/// Throws std::invalid_argument naming an unknown format, or "torchscript" for a module that is not an
/// nn::ScriptModule, before writing anything.
void export_weights(const torch::nn::Module& module, const std::string& dir, const std::string& stem,
                    const std::vector<std::string>& formats);

/// The files export_weights writes for `stem` in `dir`, one per format.
std::vector<std::string> export_paths(const std::string& dir, const std::string& stem,
                                      const std::vector<std::string>& formats);

}  // namespace trainkit::io
