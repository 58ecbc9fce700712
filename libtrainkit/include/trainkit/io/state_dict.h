#pragma once
/// @file
/// Loading named tensors into a module by name, shared by every weights format (safetensors, PyTorch's
/// `torch.save`): a module's state_dict, renaming hooks, and one report of every key that did not match.
///
///     auto report = trainkit::io::load_state_dict(*net, tensors,
///         trainkit::io::LoadOptions().strict(false).rename(trainkit::io::strip_prefix("module.")));
///     if (!report.ok()) std::cerr << report.to_string();

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

namespace trainkit::io {

/// An unreadable or malformed weights file, or weights that do not fit a module; what() names the file
/// and the offending entry.
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Named tensors in order: a state_dict.
using TensorDict = torch::OrderedDict<std::string, at::Tensor>;

/// The parameters and buffers of `module` by their dotted names, in Python's `state_dict()` order (each
/// module's own parameters, then its own buffers, then its children's, depth first). The tensors are the
/// module's own (no copy).
TensorDict state_dict(const torch::nn::Module& module);

/// A renaming hook: maps a key of a file to the module's name for it, or std::nullopt to ignore the key.
using Rename = std::function<std::optional<std::string>(const std::string&)>;

/// Removes `prefix` from keys that start with it (Python's `consume_prefix_in_state_dict_if_present`,
/// e.g. "module." of a DataParallel checkpoint); other keys pass unchanged.
Rename strip_prefix(std::string prefix);

/// Prepends `prefix` to every key.
Rename add_prefix(std::string prefix);

/// Replaces every match of the ECMAScript regex `pattern` with `replacement` (`$1` ... for groups), as
/// `std::regex_replace`; keys without a match pass unchanged. Throws std::invalid_argument for a bad regex.
Rename regex_rename(const std::string& pattern, std::string replacement);

/// Applies `steps` in order; a key that one step ignores (std::nullopt) is ignored.
Rename chain(std::vector<Rename> steps);

/// Options of load_state_dict.
struct LoadOptions {
  /// Strict: any missing, unexpected or mismatched key throws LoadReportError and the module is left
  /// unchanged. Not strict: the keys that match are loaded and the report lists the others.
  TORCH_ARG(bool, strict) = true;
  /// Maps each key of the file to the module's name (unset: keys are used as they are).
  TORCH_ARG(Rename, rename) = nullptr;
};

/// One key that did not load.
struct KeyProblem {
  std::string key;       ///< the module's name for it (after renaming)
  std::string file_key;  ///< its name in the file, before renaming ("" for a missing key)
  std::string what;      ///< why, e.g. "shape [4, 3] (F32) in the file, [3, 4] (F32) in the module"
};

/// What a load by name did: every key of the module and of the file is in exactly one list.
struct LoadReport {
  std::string source;                  ///< the file (or "tensors") the weights came from
  std::vector<std::string> loaded;     ///< module keys that were loaded
  std::vector<std::string> missing;    ///< module keys that the file lacks
  std::vector<KeyProblem> unexpected;  ///< file keys that name nothing in the module (or repeat a name)
  std::vector<KeyProblem> mismatched;  ///< keys in both, with another shape or dtype (not loaded)
  std::vector<std::string> ignored;    ///< file keys that the renaming hook dropped

  /// True when nothing is missing, unexpected or mismatched.
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  /// One line of counts, then one line per missing, unexpected and mismatched key.
  std::string to_string() const;
};

/// Raised by a strict load that did not match; what() is the report's text, naming the source.
class LoadReportError : public IoError {
 public:
  /// Wraps `report`; what() is "strict load failed: " and the report's text.
  explicit LoadReportError(LoadReport report);
  /// The report of the failed load.
  const LoadReport& report() const { return report_; }

 private:
  LoadReport report_;
};

/// Copies `tensors` into the parameters and buffers of `module` by name (after `options.rename`), without
/// recording gradients; each tensor goes to its parameter's device. A key loads only when the shape and
/// dtype agree (no silent cast). `source` names the origin in the report and in errors.
LoadReport load_state_dict(torch::nn::Module& module, const TensorDict& tensors, const LoadOptions& options = {},
                           const std::string& source = "tensors");

}  // namespace trainkit::io
