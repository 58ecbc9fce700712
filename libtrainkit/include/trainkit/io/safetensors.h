#pragma once
/// @file
/// safetensors files (Hugging Face's format, read and written by Python's `safetensors.torch`): an 8-byte
/// little-endian header length N, N bytes of JSON `{name: {"dtype", "shape", "data_offsets": [begin, end]},
/// "__metadata__": {str: str}}`, then the tensors' raw little-endian bytes in C order, whose offsets
/// (relative to the end of the header) tile the rest of the file exactly.
///
/// Dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL (every dtype PyTorch's state_dicts hold).
///
///     trainkit::io::save_safetensors("model.safetensors", *net, {{"format", "pt"}});
///     auto report = trainkit::io::load_safetensors(*net, "model.safetensors");

#include <map>
#include <string>

#include <torch/nn/module.h>

#include "trainkit/io/state_dict.h"

namespace trainkit::io {

/// A safetensors file's tensors (in the order of their data in the file) and its `__metadata__`.
struct SafetensorsFile {
  TensorDict tensors;                          ///< name → tensor (CPU)
  std::map<std::string, std::string> metadata;  ///< the `__metadata__` table (empty when absent)
};

/// Writes `tensors` (any device; written from CPU copies) and `metadata` to `path`, atomically (a temporary
/// file renamed over `path`), laid out as Python's writer does: tensors ordered by dtype alignment, then
/// name, and the header padded with spaces to a multiple of 8 bytes so that every tensor is aligned.
/// Throws std::invalid_argument for an undefined tensor, an unsupported dtype, the name "__metadata__" or
/// a name or metadata text that is not UTF-8, IoError when the file cannot be written.
void save_safetensors(const std::string& path, const TensorDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Writes the parameters and buffers of `module` (state_dict(module)) as save_safetensors does.
void save_safetensors(const std::string& path, const torch::nn::Module& module,
                      const std::map<std::string, std::string>& metadata = {});

/// Reads `path` through a private, copy-on-write memory map of the file: the tensors point into the map
/// (no copy; the map is released with the last tensor), writing to one copies only the pages it touches
/// and never changes the file. A tensor whose bytes are not aligned to its element size (possible only in
/// files from other writers) is copied out instead. The file must not be truncated while its tensors live.
/// Throws IoError naming the file and the entry for a truncated file, a header length beyond the file or
/// over 100 MB, a header that is not a JSON object, an unknown dtype, a shape that disagrees with its
/// offsets, offsets past the end, overlapping or leaving holes, and BOOL bytes other than 0 and 1.
SafetensorsFile load_safetensors(const std::string& path);

/// Reads `path` (as load_safetensors) into `module` by name (as load_state_dict, with the file as source).
LoadReport load_safetensors(torch::nn::Module& module, const std::string& path, const LoadOptions& options = {});

}  // namespace trainkit::io
