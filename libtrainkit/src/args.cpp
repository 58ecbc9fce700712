#include "trainkit/args.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace trainkit {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
    }
    out += c;
  }
  return out + "\"";
}

std::string number_text(double v) {
  if (std::isnan(v)) {
    return "nan";
  }
  if (std::isinf(v)) {
    return v > 0 ? "inf" : "-inf";
  }
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eE") == std::string::npos) {
    s += ".0";
  }
  return s;
}

}  // namespace

std::optional<double> ArgValue::as_number() const {
  if (const auto* d = get_if<double>()) {
    return *d;
  }
  if (const auto* i = get_if<int64_t>()) {
    return static_cast<double>(*i);
  }
  return std::nullopt;
}

std::string ArgValue::to_string() const {
  struct Visitor {
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return number_text(v); }
    std::string operator()(const std::string& v) const { return quoted(v); }
    std::string operator()(const Array& v) const {
      std::vector<std::string> items;
      items.reserve(v.size());
      for (const auto& e : v) {
        items.push_back(e.to_string());
      }
      return fmt::format("[{}]", fmt::join(items, ", "));
    }
    std::string operator()(const ArgTable& v) const {
      std::vector<std::string> items;
      items.reserve(v.size());
      for (const auto& [k, e] : v) {
        items.push_back(k + " = " + e.to_string());
      }
      return items.empty() ? "{}" : fmt::format("{{ {} }}", fmt::join(items, ", "));
    }
  };
  return std::visit(Visitor{}, value_);
}

const ArgValue* find_arg(const ArgTable& table, const std::string& key) {
  const auto it = std::find_if(table.begin(), table.end(), [&key](const auto& kv) { return kv.first == key; });
  return it == table.end() ? nullptr : &it->second;
}

ArgValue* find_arg(ArgTable& table, const std::string& key) {
  const auto it = std::find_if(table.begin(), table.end(), [&key](const auto& kv) { return kv.first == key; });
  return it == table.end() ? nullptr : &it->second;
}

void set_arg(ArgTable& table, const std::string& key, ArgValue value) {
  const auto it = std::find_if(table.begin(), table.end(), [&key](const auto& kv) { return kv.first == key; });
  if (it == table.end()) {
    table.emplace_back(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
}

ArgReader::ArgReader(const ArgTable& table, std::string where) : table_(&table), where_(std::move(where)) {}

bool ArgReader::has(const std::string& key) const { return find_arg(*table_, key) != nullptr; }

const ArgValue* ArgReader::use(const std::string& key) {
  if (std::find(used_.begin(), used_.end(), key) == used_.end()) {
    used_.push_back(key);
  }
  return find_arg(*table_, key);
}

void ArgReader::ignore(const std::string& key) { use(key); }

void ArgReader::fail(const std::string& key, const std::string& expected) const {
  const ArgValue* value = find_arg(*table_, key);
  if (value == nullptr) {
    throw ArgError(fmt::format("{}: {}: expected {}", where_, key, expected), key);
  }
  const std::string line = value->line() > 0 ? fmt::format(" (line {})", value->line()) : "";
  throw ArgError(fmt::format("{}: {}: expected {}, got {}{}", where_, key, expected, value->to_string(), line), key);
}

void ArgReader::fail(const std::string& message) const { throw ArgError(fmt::format("{}: {}", where_, message)); }

void ArgReader::fail_key(const std::string& key, const std::string& message) const {
  throw ArgError(fmt::format("{}: {}", where_, message), key);
}

void ArgReader::missing(const std::string& key) const {
  throw ArgError(fmt::format("{}: {} is required", where_, key), key);
}

std::optional<int64_t> ArgReader::integer(const std::string& key) {
  const ArgValue* v = use(key);
  if (v == nullptr) {
    return std::nullopt;
  }
  if (const auto* i = v->get_if<int64_t>()) {
    return *i;
  }
  fail(key, "an integer");
}

std::optional<double> ArgReader::number(const std::string& key) {
  const ArgValue* v = use(key);
  if (v == nullptr) {
    return std::nullopt;
  }
  if (auto x = v->as_number()) {
    return x;
  }
  fail(key, "a number");
}

std::optional<bool> ArgReader::boolean(const std::string& key) {
  const ArgValue* v = use(key);
  if (v == nullptr) {
    return std::nullopt;
  }
  if (const auto* b = v->get_if<bool>()) {
    return *b;
  }
  fail(key, "true or false");
}

std::optional<std::string> ArgReader::string(const std::string& key) {
  const ArgValue* v = use(key);
  if (v == nullptr) {
    return std::nullopt;
  }
  if (const auto* s = v->get_if<std::string>()) {
    return *s;
  }
  fail(key, "a string");
}

std::optional<std::vector<double>> ArgReader::numbers(const std::string& key) {
  const ArgValue* v = use(key);
  if (v == nullptr) {
    return std::nullopt;
  }
  if (auto x = v->as_number()) {
    return std::vector<double>{*x};
  }
  if (const auto* a = v->get_if<ArgValue::Array>(); a != nullptr && !a->empty()) {
    std::vector<double> out;
    for (const auto& e : *a) {
      const auto x = e.as_number();
      if (!x) {
        fail(key, "a number or an array of numbers");
      }
      out.push_back(*x);
    }
    return out;
  }
  fail(key, "a number or an array of numbers");
}

std::optional<std::vector<int64_t>> ArgReader::integers(const std::string& key) {
  const ArgValue* v = use(key);
  if (v == nullptr) {
    return std::nullopt;
  }
  const auto* a = v->get_if<ArgValue::Array>();
  if (a == nullptr) {
    fail(key, "an array of integers");
  }
  std::vector<int64_t> out;
  for (const auto& e : *a) {
    const auto* i = e.get_if<int64_t>();
    if (i == nullptr) {
      fail(key, "an array of integers");
    }
    out.push_back(*i);
  }
  return out;
}

std::optional<std::vector<ArgReader>> ArgReader::tables(const std::string& key) {
  const ArgValue* v = use(key);
  if (v == nullptr) {
    return std::nullopt;
  }
  const auto* a = v->get_if<ArgValue::Array>();
  const auto is_table = [](const ArgValue& e) { return e.get_if<ArgTable>() != nullptr; };
  if (a == nullptr || a->empty() || !std::all_of(a->begin(), a->end(), is_table)) {
    fail(key, fmt::format("a non-empty array of tables ([[{}]])", key));
  }
  std::vector<ArgReader> out;
  for (size_t i = 0; i < a->size(); ++i) {
    out.emplace_back(*(*a)[i].get_if<ArgTable>(), fmt::format("{}.{}[{}]", where_, key, i));
  }
  return out;
}

int64_t ArgReader::required_integer(const std::string& key) {
  if (auto v = integer(key)) {
    return *v;
  }
  missing(key);
}

double ArgReader::required_number(const std::string& key) {
  if (auto v = number(key)) {
    return *v;
  }
  missing(key);
}

std::string ArgReader::required_string(const std::string& key) {
  if (auto v = string(key)) {
    return *v;
  }
  missing(key);
}

std::vector<double> ArgReader::required_numbers(const std::string& key) {
  if (auto v = numbers(key)) {
    return *v;
  }
  missing(key);
}

std::vector<int64_t> ArgReader::required_integers(const std::string& key) {
  if (auto v = integers(key)) {
    return *v;
  }
  missing(key);
}

std::vector<ArgReader> ArgReader::required_tables(const std::string& key) {
  if (auto v = tables(key)) {
    return *v;
  }
  missing(key);
}

std::vector<std::string> ArgReader::unread() const {
  std::vector<std::string> out;
  for (const auto& [key, value] : *table_) {
    if (std::find(used_.begin(), used_.end(), key) == used_.end()) {
      out.push_back(key);
    }
  }
  return out;
}

void ArgReader::finish(const std::string& what) const {
  for (const auto& [key, value] : *table_) {
    if (std::find(used_.begin(), used_.end(), key) == used_.end()) {
      const std::string line = value.line() > 0 ? fmt::format(" (line {})", value.line()) : "";
      throw ArgError(fmt::format("{}: unknown key '{}'{} for {} (known: {})", where_, key, line, what,
                                 fmt::join(used_, ", ")),
                     key);
    }
  }
}

}  // namespace trainkit
