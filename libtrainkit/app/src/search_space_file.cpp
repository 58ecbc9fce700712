#include "trainkit/app/search_space_file.h"

#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "trainkit/app/config.h"
#include "trainkit/app/toml_args.h"

namespace trainkit::app {
namespace {

using tune::Param;
using tune::SearchSpace;

[[noreturn]] void space_error(const std::string& path, const std::string& key, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}: {}", path, key, what), key);
}

double number_field(const std::string& path, const std::string& name, const ArgTable& t, const char* field) {
  const ArgValue* v = find_arg(t, field);
  if (!v) space_error(path, name, fmt::format("missing \"{}\"", field));
  const auto n = v->as_number();
  if (!n) space_error(path, name, fmt::format("{}: expected a number, got {}", field, v->to_string()));
  return *n;
}

void add_param(SearchSpace& space, const std::string& path, const std::string& name, const ArgTable& t) {
  const std::set<std::string> known = {"type", "low", "high", "log", "choices"};
  for (const auto& [k, v] : t) {
    if (!known.count(k)) {
      space_error(path, name, fmt::format("unknown field \"{}\" (known: type, low, high, log, choices)", k));
    }
  }
  const auto* type = find_arg(t, "type")->get_if<std::string>();
  if (!type) space_error(path, name, "type: expected \"float\", \"int\" or \"categorical\"");
  bool log = false;
  if (const ArgValue* l = find_arg(t, "log")) {
    const auto* b = l->get_if<bool>();
    if (!b) space_error(path, name, fmt::format("log: expected true or false, got {}", l->to_string()));
    log = *b;
  }
  try {
    if (*type == "float") {
      space.add_float(name, number_field(path, name, t, "low"), number_field(path, name, t, "high"), log);
    } else if (*type == "int") {
      auto integer = [&](const char* field) {
        const ArgValue* v = find_arg(t, field);
        if (!v || !v->get_if<int64_t>()) space_error(path, name, fmt::format("{}: expected an integer", field));
        return *v->get_if<int64_t>();
      };
      space.add_int(name, integer("low"), integer("high"), log);
    } else if (*type == "categorical") {
      const ArgValue* c = find_arg(t, "choices");
      const auto* a = c ? c->get_if<ArgValue::Array>() : nullptr;
      if (!a) space_error(path, name, "choices: expected an array of strings");
      std::vector<std::string> choices;
      for (const auto& v : *a) {
        const auto* s = v.get_if<std::string>();
        if (!s) space_error(path, name, fmt::format("choices: expected strings, got {}", v.to_string()));
        choices.push_back(*s);
      }
      space.add_categorical(name, choices);
    } else {
      space_error(path, name, fmt::format("type: expected \"float\", \"int\" or \"categorical\", got \"{}\"", *type));
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    // SearchSpace's own messages start with the parameter's name.
    throw ConfigError(fmt::format("{}: {}", path, e.what()), name);
  }
}

void walk_space(SearchSpace& space, const std::string& path, const std::string& prefix, const ArgTable& table) {
  for (const auto& [key, value] : table) {
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    const auto* t = value.get_if<ArgTable>();
    if (!t) {
      space_error(path, name, fmt::format("expected a table with type = \"float\" | \"int\" | \"categorical\" "
                                          "(line {})", value.line()));
    }
    if (find_arg(*t, "type")) {
      add_param(space, path, name, *t);
    } else {
      walk_space(space, path, name, *t);
    }
  }
}

}  // namespace

tune::SearchSpace load_search_space(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw ConfigError(fmt::format("{}: cannot open the search-space file", path));
  std::stringstream ss;
  ss << f.rdbuf();
  SearchSpace space;
  walk_space(space, path, "", parse_toml(ss.str(), path));
  if (space.empty()) throw ConfigError(fmt::format("{}: no parameters (expected tables like [optimizer.lr])", path));
  return space;
}

std::vector<std::string> param_overrides(const tune::ParamSet& params) {
  std::vector<std::string> out;
  for (const auto& [name, value] : params) {
    if (const auto* s = std::get_if<std::string>(&value)) {
      out.push_back(fmt::format("{}=\"{}\"", name, *s));
    } else {
      out.push_back(fmt::format("{}={}", name, tune::to_string(value)));
    }
  }
  return out;
}

void check_space_against_config(const tune::SearchSpace& space, const std::string& space_path,
                                const std::string& config_path, const std::vector<std::string>& overrides) {
  load_config(config_path, overrides);
  for (const auto& p : space.params()) {
    // The unit-cube coordinate of p (a categorical's first one-hot coordinate) at 0 and at 1.
    size_t k = 0;
    for (const auto& q : space.params()) {
      if (q.name == p.name) break;
      k += q.kind == Param::Kind::Categorical ? q.choices.size() : 1;
    }
    for (double end : {0.0, 1.0}) {
      std::vector<double> u(static_cast<size_t>(space.dims()), 0.5);
      u[k] = end;
      const tune::ParamValue value = space.decode(u).at(p.name);
      auto with_value = overrides;
      with_value.push_back(param_overrides({{p.name, value}}).front());
      try {
        load_config(config_path, with_value);
      } catch (const std::invalid_argument& e) {
        throw ConfigError(fmt::format("{}: {}: not accepted by the config at {}: {}", space_path, p.name,
                                      tune::to_string(value), e.what()),
                          p.name);
      }
    }
  }
}

}  // namespace trainkit::app
