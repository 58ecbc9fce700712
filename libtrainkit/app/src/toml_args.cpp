#include "trainkit/app/toml_args.h"

#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include <sstream>

#include <fmt/format.h>

namespace trainkit::app {
namespace {

ArgValue convert(const toml::node& node, bool keep_lines = true);

ArgTable convert_table(const toml::table& table, bool keep_lines = true) {
  ArgTable out;
  for (const auto& [key, value] : table) {
    out.emplace_back(std::string(key.str()), convert(value, keep_lines));
  }
  return out;
}

ArgValue convert(const toml::node& node, bool keep_lines) {
  const int line = keep_lines ? static_cast<int>(node.source().begin.line) : 0;
  if (const auto* v = node.as_boolean()) {
    return ArgValue(v->get(), line);
  }
  if (const auto* v = node.as_integer()) {
    return ArgValue(v->get(), line);
  }
  if (const auto* v = node.as_floating_point()) {
    return ArgValue(v->get(), line);
  }
  if (const auto* v = node.as_string()) {
    return ArgValue(v->get(), line);
  }
  if (const auto* v = node.as_array()) {
    ArgValue::Array items;
    for (const auto& e : *v) {
      items.push_back(convert(e, keep_lines));
    }
    return ArgValue(std::move(items), line);
  }
  if (const auto* v = node.as_table()) {
    return ArgValue(convert_table(*v, keep_lines), line);
  }
  // Dates and times have no use in a training config: keep their text so that errors can show it.
  std::ostringstream text;
  node.visit([&text](const auto& value) { text << value; });
  return ArgValue(text.str(), line);
}

}  // namespace

ArgTable parse_toml(const std::string& text, const std::string& source) {
  try {
    return convert_table(toml::parse(text, source));
  } catch (const toml::parse_error& e) {
    throw ArgError(fmt::format("{}: TOML syntax error at line {}, column {}: {}", source, e.source().begin.line,
                               e.source().begin.column, e.description()));
  }
}

ArgValue parse_toml_value(const std::string& text) {
  try {
    const toml::table parsed = toml::parse("v = " + text);
    return convert(*parsed.get("v"), false);  // a --set value has no line of its own
  } catch (const toml::parse_error&) {
    return ArgValue(text);
  }
}

std::string to_toml_lines(const ArgTable& table) {
  std::string out;
  for (const auto& [key, value] : table) {
    out += fmt::format("{} = {}\n", key, value.to_string());
  }
  return out;
}

}  // namespace trainkit::app
