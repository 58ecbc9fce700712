#include "trainkit/optim/factory.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

// The built-in optimizers register themselves from their own sources; including their headers here links
// those sources into every program that uses the factory (see the registration line in each header).
#include "trainkit/optim.h"

namespace trainkit::optim {
namespace {

constexpr const char* kNoDecay1d = "no_decay_1d";
constexpr const char* kLayerDecay = "layer_decay";
constexpr const char* kLayerDecayDoc =
    "Layer-wise LR decay (timm's layer_decay): the model's layers get lr x layer_decay^(deepest - layer) and "
    "parameters with ndim <= 1 weight decay 0 (0 = off)";

constexpr const char* kLrByName = "lr_by_name";
constexpr const char* kLrByNameDoc =
    "Learning rates by parameter name, PyTorch's param groups with their own lr: rules { name, pattern (a "
    "shell-style pattern or an array of them), lr }; a parameter joins the first rule it matches, the others "
    "keep the optimizer's lr; a rule that matches nothing is an error (not with layer_decay)";

/// The rule of layer_decay: 0 (off) or a factor in (0, 1].
ValueRule<double> layer_decay_rule() { return rule::number(closed_unit_interval()); }

struct Registry {
  std::mutex mutex;
  std::vector<OptimizerEntry> entries;  // sorted by name
};

Registry& registry() {
  // Never destroyed: a factory may be called from a static object's destructor, after main() returns.
  static auto* r = new Registry;  // NOLINT(cppcoreguidelines-owning-memory)
  return *r;
}

/// A copy of the entries (registration may run on another thread during static initialization).
std::vector<OptimizerEntry> entries() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.entries;
}

const OptimizerEntry* find_entry(const std::vector<OptimizerEntry>& all, const std::string& name) {
  const auto it = std::find_if(all.begin(), all.end(), [&](const OptimizerEntry& e) { return e.name == name; });
  return it == all.end() ? nullptr : &*it;
}

const OptimizerArg* find_arg(const OptimizerEntry& entry, const std::string& key) {
  const auto it =
      std::find_if(entry.args.begin(), entry.args.end(), [&](const OptimizerArg& a) { return a.key == key; });
  return it == entry.args.end() ? nullptr : &*it;
}

std::string line_of(const ArgValue& value) {
  return value.line() > 0 ? fmt::format(" (line {})", value.line()) : std::string();
}

/// The rules of lr_by_name: an array of tables { name (optional), pattern (string or array), lr > 0 }.
std::vector<LrRule> parse_lr_by_name(ArgReader& args, const std::string& section) {
  const ArgValue& value = *trainkit::find_arg(args.table(), kLrByName);
  const auto* array = value.get_if<ArgValue::Array>();
  const auto is_table = [](const ArgValue& e) { return e.get_if<ArgTable>() != nullptr; };
  if (array == nullptr || array->empty() || !std::all_of(array->begin(), array->end(), is_table)) {
    args.fail_key(kLrByName, fmt::format("{}.{}: expected a non-empty array of tables {{ name, pattern, lr }}, got {}{}",
                                         section, kLrByName, value.to_string(), line_of(value)));
  }
  std::vector<LrRule> rules;
  for (size_t i = 0; i < array->size(); ++i) {
    ArgReader sub(*(*array)[i].get_if<ArgTable>(), fmt::format("{}: {}.{}[{}]", args.where(), section, kLrByName, i));
    LrRule rule;
    const ArgValue* pattern = trainkit::find_arg(sub.table(), "pattern");
    if (pattern == nullptr) {
      sub.fail_key("pattern", "a rule needs a pattern (a string or an array of strings)");
    }
    if (const auto* one = pattern->get_if<std::string>()) {
      rule.patterns.push_back(*one);
    } else if (const auto* many = pattern->get_if<ArgValue::Array>()) {
      for (const ArgValue& p : *many) {
        const auto* text = p.get_if<std::string>();
        if (text == nullptr) {
          sub.fail("pattern", "a string or an array of strings");
        }
        rule.patterns.push_back(*text);
      }
    }
    if (rule.patterns.empty()) {
      sub.fail("pattern", "a string or a non-empty array of strings");
    }
    sub.ignore("pattern");
    rule.lr = sub.required_number("lr");
    if (!(rule.lr > 0)) {
      sub.fail("lr", "a number > 0");
    }
    rule.name = sub.string("name").value_or(fmt::format("{}", fmt::join(rule.patterns, ",")));
    sub.finish("a rule of " + section + "." + kLrByName + " (name, pattern, lr)");
    rules.push_back(std::move(rule));
  }
  return rules;
}

std::vector<std::string> names_of(const std::vector<OptimizerEntry>& all) {
  std::vector<std::string> names;
  for (const auto& e : all) {
    names.push_back(e.name);
  }
  return names;
}

const OptimizerEntry& entry_of(const std::vector<OptimizerEntry>& all, const std::string& name) {
  const OptimizerEntry* entry = find_entry(all, name);
  if (entry == nullptr) {
    throw std::invalid_argument(
        fmt::format("unknown optimizer \"{}\" (known: {})", name, fmt::join(names_of(all), ", ")));
  }
  return *entry;
}

}  // namespace

void register_optimizer(OptimizerEntry entry) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (find_entry(r.entries, entry.name) != nullptr) {
    throw std::invalid_argument(fmt::format("register_optimizer: optimizer \"{}\" is already registered", entry.name));
  }
  // Sorted by name: registration runs during static initialization, in an order that depends on linking.
  const auto at = std::lower_bound(r.entries.begin(), r.entries.end(), entry.name,
                                   [](const OptimizerEntry& e, const std::string& n) { return e.name < n; });
  r.entries.insert(at, std::move(entry));
}

bool unregister_optimizer(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it =
      std::find_if(r.entries.begin(), r.entries.end(), [&](const OptimizerEntry& e) { return e.name == name; });
  if (it == r.entries.end()) return false;
  r.entries.erase(it);
  return true;
}

std::vector<std::string> optimizer_names() { return names_of(entries()); }

OptimizerSpec parse_optimizer(const std::string& name, ArgReader& args, const std::string& section) {
  const auto all = entries();
  const OptimizerEntry* entry = find_entry(all, name);
  if (entry == nullptr) {
    args.fail_key("name", fmt::format("{}.name: unknown optimizer \"{}\" (known: {})", section, name,
                                      fmt::join(names_of(all), ", ")));
  }
  OptimizerSpec spec;
  spec.name = name;
  spec.options = entry->defaults();
  for (const std::string& key : args.unread()) {
    const ArgValue& value = *trainkit::find_arg(args.table(), key);
    if (key == kNoDecay1d) {
      const auto* b = value.get_if<bool>();
      if (b == nullptr) {
        args.fail_key(key, fmt::format("{}.{}: expected true or false, got {}{}", section, key, value.to_string(),
                                       line_of(value)));
      }
      spec.no_decay_1d = *b;
    } else if (key == kLayerDecay) {
      const auto rule = layer_decay_rule();
      const auto x = rule.parse(value);
      if (!x) {
        args.fail_key(key, fmt::format("{}.{}: expected {}, got {}{}", section, key, rule.expected, value.to_string(),
                                       line_of(value)));
      }
      spec.layer_decay = *x;
    } else if (key == kLrByName) {
      spec.lr_by_name = parse_lr_by_name(args, section);
    } else if (const OptimizerArg* arg = find_arg(*entry, key)) {
      if (!arg->read(value, *spec.options)) {
        args.fail_key(key, fmt::format("{}.{}: expected {}, got {}{}", section, key, arg->expected,
                                       value.to_string(), line_of(value)));
      }
    } else {
      std::vector<std::string> takers;
      for (const auto& other : all) {
        if (find_arg(other, key) != nullptr) {
          takers.push_back(other.name);
        }
      }
      if (!takers.empty()) {
        args.fail_key(key, fmt::format("{}.{} does not apply to optimizer \"{}\" (only to {})", section, key,
                                       name, fmt::join(takers, ", ")));
      }
      std::vector<std::string> known;
      for (const auto& a : entry->args) {
        known.push_back(section + "." + a.key);
      }
      known.push_back(section + "." + kNoDecay1d);
      known.push_back(section + "." + kLayerDecay);
      known.push_back(section + "." + kLrByName);
      args.fail_key(key, fmt::format("unknown key '{}.{}'{} for optimizer \"{}\" (known: {})", section, key,
                                     line_of(value), name, fmt::join(known, ", ")));
    }
    args.ignore(key);
  }
  if (spec.layer_decay != 0 && !spec.lr_by_name.empty()) {
    args.fail_key(kLrByName, fmt::format("{0}.{1} and {0}.{2} both set the param groups' learning rates; use one",
                                         section, kLayerDecay, kLrByName));
  }
  args.finish(fmt::format("optimizer \"{}\"", name));
  try {
    entry->validate(*spec.options);
  } catch (const std::invalid_argument& e) {
    args.fail(fmt::format("{}: {}", section, e.what()));
  }
  return spec;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<at::Tensor>& params) {
  const auto all = entries();
  const OptimizerEntry& entry = entry_of(all, spec.name);
  if (spec.no_decay_1d) {
    return entry.make(entry.no_decay_groups(params, *spec.options), *spec.options);
  }
  return entry.make({torch::optim::OptimizerParamGroup(params)}, *spec.options);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<LayerDecayGroup>& groups) {
  const auto all = entries();
  const OptimizerEntry& entry = entry_of(all, spec.name);
  return entry.make(entry.layer_groups(groups, *spec.options), *spec.options);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  const auto all = entries();
  return entry_of(all, spec.name).make(groups, *spec.options);
}

ArgTable optimizer_args(const OptimizerSpec& spec) {
  const auto all = entries();
  const OptimizerEntry& entry = entry_of(all, spec.name);
  ArgTable out;
  for (const auto& arg : entry.args) {
    if (auto value = arg.show(*spec.options)) {
      out.emplace_back(arg.key, std::move(*value));
    }
  }
  out.emplace_back(kNoDecay1d, ArgValue(spec.no_decay_1d));
  out.emplace_back(kLayerDecay, ArgValue(spec.layer_decay));
  if (!spec.lr_by_name.empty()) {
    ArgValue::Array rules;
    for (const LrRule& rule : spec.lr_by_name) {
      ArgValue::Array patterns(rule.patterns.begin(), rule.patterns.end());
      rules.emplace_back(ArgTable{{"name", ArgValue(rule.name)}, {"pattern", ArgValue(patterns)}, {"lr", ArgValue(rule.lr)}});
    }
    out.emplace_back(kLrByName, ArgValue(rules));
  }
  return out;
}

std::vector<OptimizerArgDoc> optimizer_arg_docs() {
  struct Seen {
    OptimizerArgDoc doc;
    std::vector<std::pair<std::string, std::vector<std::string>>> meanings;  // meaning -> its optimizers
    std::vector<std::pair<std::string, std::vector<std::string>>> types;     // type -> its optimizers
    std::vector<std::string> defaults;                                        // each optimizer's, as text
    std::optional<ArgValue> first_default;
  };
  const auto all = entries();
  std::vector<Seen> seen;
  for (const auto& entry : all) {
    const auto defaults = entry.defaults();
    for (const auto& arg : entry.args) {
      auto it = std::find_if(seen.begin(), seen.end(), [&](const Seen& s) { return s.doc.name == arg.key; });
      if (it == seen.end()) {
        seen.push_back({{arg.key, arg.type, "", {}, std::nullopt}, {}, {}, {}, std::nullopt});
        it = std::prev(seen.end());
      }
      it->doc.optimizers.push_back(entry.name);
      auto meaning = std::find_if(it->meanings.begin(), it->meanings.end(),
                                  [&](const auto& m) { return m.first == arg.doc; });
      if (meaning == it->meanings.end()) {
        it->meanings.push_back({arg.doc, {}});
        meaning = std::prev(it->meanings.end());
      }
      meaning->second.push_back(entry.name);
      auto type = std::find_if(it->types.begin(), it->types.end(), [&](const auto& t) { return t.first == arg.type; });
      if (type == it->types.end()) {
        it->types.push_back({arg.type, {}});
        type = std::prev(it->types.end());
      }
      type->second.push_back(entry.name);
      const auto value = arg.show(*defaults);
      it->defaults.push_back(value ? value->to_string() : std::string("unset"));
      if (!it->first_default) {
        it->first_default = value;
      }
    }
  }
  std::vector<OptimizerArgDoc> docs;
  for (auto& s : seen) {
    if (s.meanings.size() == 1) {
      s.doc.doc = s.meanings.front().first;
    } else {
      std::vector<std::string> parts;
      for (const auto& [meaning, names] : s.meanings) {
        // "adamw: decoupled weight decay ..." reads as one sentence: the meaning starts lower case.
        std::string text = meaning;
        if (text.size() >= 2 && text[0] >= 'A' && text[0] <= 'Z' && text[1] >= 'a' && text[1] <= 'z') {
          text[0] = static_cast<char>(text[0] - 'A' + 'a');
        }
        parts.push_back(fmt::format("{}: {}", fmt::join(names, ", "), text));
      }
      s.doc.doc = fmt::format("{}", fmt::join(parts, "; "));
    }
    // Types that differ (Adafactor's optional lr): the most common one, then each other one after its optimizers.
    std::stable_sort(s.types.begin(), s.types.end(),
                     [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
    s.doc.type = s.types.front().first;
    for (size_t i = 1; i < s.types.size(); ++i) {
      s.doc.type += fmt::format("; {}: {}", fmt::join(s.types[i].second, ", "), s.types[i].first);
    }
    const bool same = std::all_of(s.defaults.begin(), s.defaults.end(),
                                  [&](const std::string& d) { return d == s.defaults.front(); });
    if (same && s.first_default) {
      s.doc.default_value = s.first_default;
    }
    docs.push_back(std::move(s.doc));
  }
  docs.push_back({kNoDecay1d, "boolean",
                  "Parameters with ndim <= 1 (biases, norm weights) in a group with weight_decay 0", names_of(all),
                  ArgValue(false)});
  docs.push_back({kLayerDecay, layer_decay_rule().type, kLayerDecayDoc, names_of(all), ArgValue(0.0)});
  docs.push_back({kLrByName, "array of tables", kLrByNameDoc, names_of(all), std::nullopt});
  return docs;
}

}  // namespace trainkit::optim
