#pragma once
/// @file
/// PyTorch's `torch.save` files of a state_dict (a zip archive holding a pickled dict of tensors): written
/// for Python's `torch.load(path, weights_only=True)`, read from Python's `torch.save(model.state_dict(),
/// path)`, through LibTorch's own pickler and zip archive (the steps of `torch::pickle_save` /
/// `torch::pickle_load`, adapted: the dict is written untagged, which `weights_only` requires, and
/// Python's OrderedDict, which LibTorch's unpickler reads as None, is read as a dict).
///
///     trainkit::io::save_pt("model.pt", *net);        // Python: net.load_state_dict(torch.load("model.pt"))
///     auto report = trainkit::io::load_pt(*net, "pretrained.pt");

#include <string>

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include "trainkit/io/state_dict.h"

namespace trainkit::io {

/// Writes `tensors` to `path` as a dict of CPU tensors that `torch.load(path, weights_only=True)` reads,
/// atomically (a temporary file renamed over `path`). Throws std::invalid_argument for an undefined
/// tensor, IoError when the file cannot be written.
void save_pt(const std::string& path, const TensorDict& tensors);

/// Writes the parameters and buffers of `module` (state_dict(module)) as save_pt does.
void save_pt(const std::string& path, const torch::nn::Module& module);

/// Reads the object of a `torch.save` file (a dict, list, tuple, number, string or tensor, nested; tensors on
/// the CPU), with a top-level OrderedDict read as a dict; the whole file is read into memory. Throws IoError
/// naming the file for an unreadable archive.
c10::IValue load_pt_object(const std::string& path);

/// Reads a `torch.save` file whose object is a dict (or OrderedDict) of string → tensor, in the file's
/// order; the whole file is read into memory. Throws IoError naming the file for an unreadable archive
/// and naming the key for a value that is not a tensor.
TensorDict load_pt(const std::string& path);

/// Reads `path` (as load_pt) into `module` by name (as load_state_dict, with the file as source).
LoadReport load_pt(torch::nn::Module& module, const std::string& path, const LoadOptions& options = {});

}  // namespace trainkit::io
