#include "trainkit/io/export.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trainkit/io/safetensors.h"
#include "trainkit/io/torch_save.h"
#include "trainkit/nn/script_module.h"

namespace trainkit::io {
namespace {

std::string extension_of(const std::string& format) {
  if (format == "safetensors") {
    return ".safetensors";
  }
  if (format == "state_dict") {
    return ".pth";
  }
  if (format == "torchscript") {
    return ".torchscript.pt";
  }
  throw std::invalid_argument(fmt::format("export_weights: unknown format \"{}\" (known: {})", format,
                                          fmt::join(export_formats(), ", ")));
}

}  // namespace

const std::vector<std::string>& export_formats() {
  static const std::vector<std::string> names = {"safetensors", "state_dict", "torchscript"};
  return names;
}

std::vector<std::string> export_paths(const std::string& dir, const std::string& stem,
                                      const std::vector<std::string>& formats) {
  std::vector<std::string> paths;
  for (const std::string& format : formats) {
    paths.push_back((std::filesystem::path(dir) / (stem + extension_of(format))).string());
  }
  return paths;
}

void export_weights(const torch::nn::Module& module, const std::string& dir, const std::string& stem,
                    const std::vector<std::string>& formats) {
  const std::vector<std::string> paths = export_paths(dir, stem, formats);  // checks every format first
  const auto* script = dynamic_cast<const nn::ScriptModuleImpl*>(&module);
  if (script == nullptr && std::find(formats.begin(), formats.end(), "torchscript") != formats.end()) {
    throw std::invalid_argument(fmt::format(
        "export_weights: format \"torchscript\" needs a TorchScript model (nn::ScriptModule), not {}", module.name()));
  }
  for (size_t i = 0; i < formats.size(); ++i) {
    if (formats[i] == "safetensors") {
      save_safetensors(paths[i], module, {{"format", "pt"}});
    } else if (formats[i] == "torchscript") {
      script->save(paths[i]);  // the script module with the module's current weights
    } else {
      save_pt(paths[i], module);
    }
  }
}

}  // namespace trainkit::io
