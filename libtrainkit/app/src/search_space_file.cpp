#include "trainkit/app/search_space_file.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

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

// Top-level keys of a search-space file that choose the sampler and pruner rather than name a tuned key.
const std::set<std::string> kChoiceKeys = {"sampler", "pruner", "tpe", "successive_halving", "hyperband"};

void walk_space(SearchSpace& space, const std::string& path, const std::string& prefix, const ArgTable& table) {
  for (const auto& [key, value] : table) {
    if (prefix.empty() && kChoiceKeys.count(key)) continue;
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

ArgTable read_space_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw ConfigError(fmt::format("{}: cannot open the search-space file", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_toml(ss.str(), path);
}

/// Reads the options of table `section` (`[tpe]`, ...) through `fields` (key -> setter that returns false for
/// a value of the wrong type, with what was expected).
using FieldSetter = std::function<bool(const ArgValue&)>;
void read_section(const std::string& path, const std::string& section, const ArgValue& value,
                  const std::vector<std::tuple<std::string, std::string, FieldSetter>>& fields) {
  const auto* table = value.get_if<ArgTable>();
  if (!table) space_error(path, section, fmt::format("expected a table, got {}", value.to_string()));
  for (const auto& [key, v] : *table) {
    const auto field = std::find_if(fields.begin(), fields.end(), [&, &k = key](const auto& f) {
      return std::get<0>(f) == k;
    });
    if (field == fields.end()) {
      std::string known;
      for (const auto& f : fields) known += (known.empty() ? "" : ", ") + std::get<0>(f);
      space_error(path, section + "." + key, fmt::format("unknown option (known: {})", known));
    }
    if (!std::get<2>(*field)(v)) {
      space_error(path, section + "." + key, fmt::format("expected {}, got {}", std::get<1>(*field), v.to_string()));
    }
  }
}

/// A value of TOML type T (int64_t: an integer, bool: true or false).
template <class T, class Set>
FieldSetter typed(Set set) {
  return [set](const ArgValue& v) {
    const auto* x = v.get_if<T>();
    if (x) set(*x);
    return x != nullptr;
  };
}

template <class Set>
FieldSetter integer(Set set) {
  return typed<int64_t>(set);
}

template <class Set>
FieldSetter boolean(Set set) {
  return typed<bool>(set);
}

template <class Set>
FieldSetter number(Set set) {
  return [set](const ArgValue& v) {
    const auto n = v.as_number();
    if (n) set(*n);
    return n.has_value();
  };
}

/// An integer, or "auto" (empty).
template <class Set>
FieldSetter integer_or_auto(Set set) {
  return [set](const ArgValue& v) {
    if (const auto* s = v.get_if<std::string>(); s && *s == "auto") {
      set(std::optional<int64_t>());
      return true;
    }
    const auto* i = v.get_if<int64_t>();
    if (i) set(std::optional<int64_t>(*i));
    return i != nullptr;
  };
}

std::string string_choice(const std::string& path, const std::string& key, const ArgValue& v,
                          const std::vector<std::string>& allowed) {
  const auto* s = v.get_if<std::string>();
  if (!s || std::find(allowed.begin(), allowed.end(), *s) == allowed.end()) {
    space_error(path, key, fmt::format("expected \"{}\", got {}", fmt::join(allowed, "\", \""), v.to_string()));
  }
  return *s;
}

}  // namespace

TuneChoices load_tune_choices(const std::string& path) {
  TuneChoices c;
  auto& tpe = c.tpe;
  auto& sh = c.successive_halving;
  auto& hb = c.hyperband;
  for (const auto& [key, value] : read_space_file(path)) {
    if (key == "sampler") {
      c.sampler = string_choice(path, key, value, {"gp", "tpe", "random"});
    } else if (key == "pruner") {
      c.pruner = string_choice(path, key, value, {"none", "median", "successive_halving", "hyperband"});
    } else if (key == "tpe") {
      auto parzen = tpe.parzen();
      read_section(path, key, value,
                   {{"n_startup_trials", "an integer", integer([&](int64_t v) {
                       tpe.n_startup_trials(v);
                       c.tpe_startup_set = true;
                     })},
                    {"n_ei_candidates", "an integer", integer([&](int64_t v) { tpe.n_ei_candidates(v); })},
                    {"multivariate", "true or false", boolean([&](bool v) { tpe.multivariate(v); })},
                    {"constant_liar", "true or false", boolean([&](bool v) { tpe.constant_liar(v); })},
                    {"prior_weight", "a number", number([&](double v) { parzen.prior_weight(v); })},
                    {"consider_magic_clip", "true or false", boolean([&](bool v) { parzen.consider_magic_clip(v); })},
                    {"consider_endpoints", "true or false", boolean([&](bool v) { parzen.consider_endpoints(v); })}});
      tpe.parzen(parzen);
    } else if (key == "successive_halving") {
      read_section(path, key, value,
                   {{"min_resource", "an integer or \"auto\"",
                     integer_or_auto([&](std::optional<int64_t> v) { sh.min_resource(v); })},
                    {"reduction_factor", "an integer", integer([&](int64_t v) { sh.reduction_factor(v); })},
                    {"min_early_stopping_rate", "an integer",
                     integer([&](int64_t v) { sh.min_early_stopping_rate(v); })},
                    {"bootstrap_count", "an integer", integer([&](int64_t v) { sh.bootstrap_count(v); })}});
    } else if (key == "hyperband") {
      read_section(path, key, value,
                   {{"min_resource", "an integer", integer([&](int64_t v) { hb.min_resource(v); })},
                    {"max_resource", "an integer or \"auto\"",
                     integer_or_auto([&](std::optional<int64_t> v) { hb.max_resource(v); })},
                    {"reduction_factor", "an integer", integer([&](int64_t v) { hb.reduction_factor(v); })},
                    {"bootstrap_count", "an integer", integer([&](int64_t v) { hb.bootstrap_count(v); })}});
    }
  }
  // The options' own rules, reported against the file's table.
  const auto check = [&](const char* section, const auto& make) {
    try {
      make();
    } catch (const std::invalid_argument& e) {
      space_error(path, section, e.what());
    }
  };
  check("tpe", [&] { tune::TPESampler{tpe}; });
  check("successive_halving", [&] { tune::SuccessiveHalvingPruner{sh}; });
  check("hyperband", [&] { tune::HyperbandPruner{hb}; });
  return c;
}

tune::SearchSpace load_search_space(const std::string& path) {
  SearchSpace space;
  walk_space(space, path, "", read_space_file(path));
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
