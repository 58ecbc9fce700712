#include "trainkit/io/torch_save.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include <ATen/core/Dict.h>
#include <fmt/format.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include "detail/atomic_file.h"

namespace trainkit::io {

void save_pt(const std::string& path, const TensorDict& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& item : tensors) {
    if (!item.value().defined()) {
      throw std::invalid_argument(fmt::format("save_pt: tensor '{}' is undefined", item.key()));
    }
    at::Tensor t = item.value().detach().to(at::kCPU);
    // The pickle holds whole storages: a view is written as its own compact copy, not with its base.
    if (!t.is_contiguous() || t.storage_offset() != 0 || t.storage().nbytes() != t.nbytes()) {
      t = t.clone(at::MemoryFormat::Contiguous);
    }
    dict.insert(item.key(), t);
  }
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  try {
    detail::write_file_atomic(
        path, [&bytes](std::ostream& out) { out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); });
  } catch (const detail::AtomicWriteError& e) {
    throw IoError(e.what());
  }
}

void save_pt(const std::string& path, const torch::nn::Module& module) { save_pt(path, state_dict(module)); }

TensorDict load_pt(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw IoError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    throw IoError(fmt::format("{}: not a readable torch.save file: {}", path, e.what_without_backtrace()));
  }
  if (!value.isGenericDict()) {
    throw IoError(fmt::format("{}: holds a {}, not a dict of tensors", path, value.tagKind()));
  }
  TensorDict tensors;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString()) {
      throw IoError(fmt::format("{}: a key is a {}, not a string", path, item.key().tagKind()));
    }
    const std::string key = item.key().toStringRef();
    if (!item.value().isTensor()) {
      throw IoError(fmt::format("{}: the value of '{}' is a {}, not a tensor", path, key, item.value().tagKind()));
    }
    tensors.insert(key, item.value().toTensor());
  }
  return tensors;
}

LoadReport load_pt(torch::nn::Module& module, const std::string& path, const LoadOptions& options) {
  return load_state_dict(module, load_pt(path), options, path);
}

}  // namespace trainkit::io
