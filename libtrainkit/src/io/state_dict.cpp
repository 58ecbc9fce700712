#include "trainkit/io/state_dict.h"

#include <map>
#include <regex>
#include <sstream>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <torch/torch.h>


namespace trainkit::io {
namespace {

std::string describe(const at::Tensor& t) {
  return fmt::format("[{}] ({})", fmt::join(t.sizes(), ", "), c10::toString(t.scalar_type()));
}

void add_own(TensorDict& out, const std::string& prefix, const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    out.insert(prefix + item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    out.insert(prefix + item.key(), item.value());
  }
  for (const auto& child : module.named_children()) {
    add_own(out, prefix + child.key() + ".", *child.value());
  }
}

}  // namespace

TensorDict state_dict(const torch::nn::Module& module) {
  TensorDict out;
  add_own(out, "", module);
  return out;
}

Rename strip_prefix(std::string prefix) {
  return [prefix = std::move(prefix)](const std::string& key) -> std::optional<std::string> {
    if (key.compare(0, prefix.size(), prefix) == 0) {
      return key.substr(prefix.size());
    }
    return key;
  };
}

Rename add_prefix(std::string prefix) {
  return [prefix = std::move(prefix)](const std::string& key) -> std::optional<std::string> { return prefix + key; };
}

Rename regex_rename(const std::string& pattern, std::string replacement) {
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw std::invalid_argument(fmt::format("regex_rename: invalid pattern '{}': {}", pattern, e.what()));
  }
  return [re = std::move(re), replacement = std::move(replacement)](const std::string& key)
             -> std::optional<std::string> { return std::regex_replace(key, re, replacement); };
}

Rename chain(std::vector<Rename> steps) {
  return [steps = std::move(steps)](const std::string& key) -> std::optional<std::string> {
    std::optional<std::string> name = key;
    for (const auto& step : steps) {
      if (!step) {
        continue;
      }
      name = step(*name);
      if (!name) {
        return std::nullopt;
      }
    }
    return name;
  };
}

std::string LoadReport::to_string() const {
  std::ostringstream out;
  out << fmt::format("{}: {} loaded, {} missing, {} unexpected, {} mismatched, {} ignored", source, loaded.size(),
                     missing.size(), unexpected.size(), mismatched.size(), ignored.size());
  for (const auto& key : missing) {
    out << fmt::format("\n  missing: '{}'", key);
  }
  for (const auto& p : unexpected) {
    out << fmt::format("\n  unexpected: '{}'", p.file_key);
    if (p.key != p.file_key) {
      out << fmt::format(" (renamed to '{}')", p.key);
    }
    if (!p.what.empty()) {
      out << ": " << p.what;
    }
  }
  for (const auto& p : mismatched) {
    out << fmt::format("\n  mismatched: '{}'", p.key);
    if (p.key != p.file_key) {
      out << fmt::format(" (file key '{}')", p.file_key);
    }
    out << ": " << p.what;
  }
  return out.str();
}

LoadReportError::LoadReportError(LoadReport report)
    : IoError("strict load failed: " + report.to_string()), report_(std::move(report)) {}

LoadReport load_state_dict(torch::nn::Module& module, const TensorDict& tensors, const LoadOptions& options,
                           const std::string& source) {
  LoadReport report;
  report.source = source;
  TensorDict targets = state_dict(module);
  // The module key each file key loads into, in the file's order; a key named twice loads once.
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  std::unordered_map<std::string, std::string> taken;  // module key -> the file key that took it
  for (const auto& item : tensors) {
    const std::string& file_key = item.key();
    const std::optional<std::string> renamed = options.rename() ? options.rename()(file_key) : file_key;
    if (!renamed) {
      report.ignored.push_back(file_key);
      continue;
    }
    const std::string& key = *renamed;
    const at::Tensor* target = targets.find(key);
    if (target == nullptr) {
      report.unexpected.push_back({key, file_key, ""});
      continue;
    }
    if (const auto first = taken.find(key); first != taken.end()) {
      report.unexpected.push_back({key, file_key, fmt::format("'{}' already loads into '{}'", first->second, key)});
      continue;
    }
    taken.emplace(key, file_key);
    const at::Tensor& value = item.value();
    if (!value.defined() || value.sizes() != target->sizes() || value.scalar_type() != target->scalar_type()) {
      report.mismatched.push_back(
          {key, file_key,
           fmt::format("{} in the file, {} in the module", value.defined() ? describe(value) : "undefined",
                       describe(*target))});
      continue;
    }
    copies.emplace_back(*target, value);
    report.loaded.push_back(key);
  }
  for (const auto& item : targets) {
    if (taken.count(item.key()) == 0) {
      report.missing.push_back(item.key());
    }
  }
  if (options.strict() && !report.ok()) {
    throw LoadReportError(std::move(report));
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, value] : copies) {
    target.copy_(value);
  }
  return report;
}

}  // namespace trainkit::io
