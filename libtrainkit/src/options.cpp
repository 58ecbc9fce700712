#include "trainkit/options.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace trainkit::rule {
namespace {

/// "a number > 0", "an integer >= 0", "an array ...": the expected-text of a type text.
std::string article(const std::string& type) {
  const bool vowel = !type.empty() && std::string("aeiou").find(type.front()) != std::string::npos;
  return (vowel ? "an " : "a ") + type;
}

std::string quoted_list(const std::vector<std::string>& choices, const char* separator) {
  return fmt::format("\"{}\"", fmt::join(choices, std::string("\"") + separator + "\""));
}

std::optional<double> number_in(const ArgValue& v, const NumberRule& range) {
  const auto x = v.as_number();
  return x && range.allows(*x) ? x : std::nullopt;
}

ArgValue show_number(const double& x) { return ArgValue(x); }

/// `v` as numbers when it is an array of numbers in `range` (empty allowed), else nullopt.
std::optional<std::vector<double>> numbers_in(const ArgValue& v, const NumberRule& range) {
  const auto* a = v.get_if<ArgValue::Array>();
  if (a == nullptr) {
    return std::nullopt;
  }
  std::vector<double> out;
  for (const auto& e : *a) {
    const auto x = number_in(e, range);
    if (!x) {
      return std::nullopt;
    }
    out.push_back(*x);
  }
  return out;
}

/// `items` as an array value.
template <class T>
ArgValue array_value(const std::vector<T>& items) {
  ArgValue::Array out;
  for (const T& x : items) {
    out.emplace_back(x);
  }
  return ArgValue(std::move(out));
}

}  // namespace

ValueRule<double> number(const NumberRule& range) {
  return {range.text, article(range.text), [range](const ArgValue& v) { return number_in(v, range); }, show_number};
}

ValueRule<double> positive_or_inf() {
  return {"number > 0 or inf", "a number > 0",
          [](const ArgValue& v) -> std::optional<double> {
            if (const auto* f = v.get_if<double>(); f != nullptr && std::isinf(*f) && *f > 0) {
              return *f;
            }
            return number_in(v, positive());
          },
          show_number};
}

ValueRule<std::tuple<double, double>> number_pair(const NumberRule& range) {
  const std::string bounds = range.text.substr(range.text.find(' ') + 1);  // "in [0, 1)"
  return {"[number, number] " + bounds, "an array of two numbers " + bounds,
          [range](const ArgValue& v) -> std::optional<std::tuple<double, double>> {
            const auto* a = v.get_if<ArgValue::Array>();
            if (a == nullptr || a->size() != 2) {
              return std::nullopt;
            }
            const auto x = number_in((*a)[0], range);
            const auto y = number_in((*a)[1], range);
            if (!x || !y) {
              return std::nullopt;
            }
            return std::make_tuple(*x, *y);
          },
          [](const std::tuple<double, double>& p) {
            return ArgValue(ArgValue::Array{ArgValue(std::get<0>(p)), ArgValue(std::get<1>(p))});
          }};
}

ValueRule<int64_t> integer(int64_t lo, int64_t hi) {
  const std::string type = hi == std::numeric_limits<int64_t>::max() ? fmt::format("integer >= {}", lo)
                                                                     : fmt::format("integer in [{}, {}]", lo, hi);
  return {type, article(type),
          [lo, hi](const ArgValue& v) -> std::optional<int64_t> {
            const auto* i = v.get_if<int64_t>();
            return i != nullptr && *i >= lo && *i <= hi ? std::optional<int64_t>(*i) : std::nullopt;
          },
          [](const int64_t& i) { return ArgValue(i); }};
}

ValueRule<bool> boolean() {
  return {"boolean", "true or false",
          [](const ArgValue& v) -> std::optional<bool> {
            const auto* b = v.get_if<bool>();
            return b != nullptr ? std::optional<bool>(*b) : std::nullopt;
          },
          [](const bool& b) { return ArgValue(b); }};
}

ValueRule<std::string> text_where(std::string type, std::string expected,
                                  std::function<bool(const std::string&)> allows) {
  return {std::move(type), std::move(expected),
          [allows = std::move(allows)](const ArgValue& v) -> std::optional<std::string> {
            const auto* s = v.get_if<std::string>();
            return s != nullptr && allows(*s) ? std::optional<std::string>(*s) : std::nullopt;
          },
          [](const std::string& s) { return ArgValue(s); }};
}

ValueRule<std::string> text() {
  return text_where("string", "a string", [](const std::string&) { return true; });
}

ValueRule<std::string> one_of(std::vector<std::string> choices) {
  return text_where(quoted_list(choices, " or "), "one of " + quoted_list(choices, ", "),
                    [choices](const std::string& s) { return std::find(choices.begin(), choices.end(), s) != choices.end(); });
}

ValueRule<std::vector<std::string>> distinct_of(std::vector<std::string> choices) {
  return distinct_where("array of " + quoted_list(choices, ", "),
                        "an array of distinct values of " + quoted_list(choices, ", "),
                        [choices](const std::string& s) { return std::find(choices.begin(), choices.end(), s) != choices.end(); });
}

ValueRule<std::vector<std::string>> distinct_where(std::string type, std::string expected,
                                                   std::function<bool(const std::string&)> allows) {
  return {std::move(type), std::move(expected),
          [allows = std::move(allows)](const ArgValue& v) -> std::optional<std::vector<std::string>> {
            const auto* a = v.get_if<ArgValue::Array>();
            if (a == nullptr) {
              return std::nullopt;
            }
            std::vector<std::string> out;
            for (const auto& e : *a) {
              const auto* s = e.get_if<std::string>();
              if (s == nullptr || !allows(*s) || std::find(out.begin(), out.end(), *s) != out.end()) {
                return std::nullopt;
              }
              out.push_back(*s);
            }
            return out;
          },
          [](const std::vector<std::string>& items) { return array_value(items); }};
}

ValueRule<std::vector<double>> numbers(const NumberRule& range) {
  const std::string bounds = range.text.substr(range.text.find(' ') + 1);  // "> 0", "in [0, 1)"
  return {fmt::format("{} or [number, ...] {} (one per group)", range.text, bounds),
          fmt::format("{} or a non-empty array of numbers {}", article(range.text), bounds),
          [range](const ArgValue& v) -> std::optional<std::vector<double>> {
            if (const auto x = number_in(v, range)) {
              return std::vector<double>{*x};
            }
            auto out = numbers_in(v, range);
            return out && !out->empty() ? out : std::nullopt;
          },
          [](const std::vector<double>& items) {
            return items.size() == 1 ? ArgValue(items.front()) : array_value(items);
          }};
}

ValueRule<std::vector<double>> number_array(const NumberRule& range) {
  const std::string bounds = range.text.substr(range.text.find(' ') + 1);
  return {fmt::format("array of numbers {}", bounds), fmt::format("an array of numbers {}", bounds),
          [range](const ArgValue& v) { return numbers_in(v, range); },
          [](const std::vector<double>& items) { return array_value(items); }};
}

ValueRule<std::vector<int64_t>> integers(int64_t lo, int64_t hi) {
  const std::string each = hi == std::numeric_limits<int64_t>::max() ? fmt::format("integers >= {}", lo)
                                                                     : fmt::format("integers in [{}, {}]", lo, hi);
  return {"array of " + each, "a non-empty array of " + each,
          [lo, hi](const ArgValue& v) -> std::optional<std::vector<int64_t>> {
            const auto* a = v.get_if<ArgValue::Array>();
            if (a == nullptr || a->empty()) {
              return std::nullopt;
            }
            std::vector<int64_t> out;
            for (const auto& e : *a) {
              const auto* i = e.get_if<int64_t>();
              if (i == nullptr || *i < lo || *i > hi) {
                return std::nullopt;
              }
              out.push_back(*i);
            }
            return out;
          },
          [](const std::vector<int64_t>& items) { return array_value(items); }};
}

ValueRule<std::chrono::milliseconds> seconds(const NumberRule& range) {
  return {range.text, article(range.text),
          [range](const ArgValue& v) -> std::optional<std::chrono::milliseconds> {
            const auto x = number_in(v, range);
            if (!x) {
              return std::nullopt;
            }
            return std::chrono::milliseconds(static_cast<int64_t>(*x * 1000.0));
          },
          [](const std::chrono::milliseconds& ms) { return ArgValue(static_cast<double>(ms.count()) / 1000.0); }};
}

}  // namespace trainkit::rule
