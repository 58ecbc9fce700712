#pragma once
/// @file
/// Options bound once. Each Options struct lists its configurable fields in one OptionBinding: the key, a
/// rule (type and range) and one line of help per field. That list drives reading the options from an
/// ArgTable (a TOML config, `--set`), the range checks and their messages, printing the effective values
/// and the key documentation; `trainkit train`'s config sections, the optimizer registry and the Options
/// structs of the training hooks all use it.
///
///     struct WarmupOptions {
///       TORCH_ARG(int64_t, steps) = 100;
///       TORCH_ARG(std::string, shape) = "linear";
///       static const OptionBinding<WarmupOptions>& binding() {
///         static const auto b = OptionBinding<WarmupOptions>()
///                                   .bind(TRAINKIT_OPTION(steps), rule::integer(0), "Warm-up steps")
///                                   .bind(TRAINKIT_OPTION(shape), rule::one_of({"linear", "cos"}), "Its shape");
///         return b;
///       }
///     };
///     WarmupOptions o;
///     ArgReader args(table, "train.toml: [warmup]");
///     read_options(WarmupOptions::binding(), args, o);   // "train.toml: [warmup]: steps: expected ..."

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/args.h"

namespace trainkit {

/// A range of numbers and its text ("number > 0").
struct NumberRule {
  /// How docs and messages describe the range.
  std::string text;
  /// Lower bound.
  double lo = -std::numeric_limits<double>::infinity();
  /// True: x > lo; false: x >= lo.
  bool lo_open = false;
  /// Upper bound.
  double hi = std::numeric_limits<double>::infinity();
  /// True: x < hi; false: x <= hi.
  bool hi_open = false;
  /// True when `x` is finite and in the range.
  bool allows(double x) const {
    return std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
};
/// x > 0.
inline NumberRule positive() { return {"number > 0", 0.0, true}; }
/// x >= 0.
inline NumberRule non_negative() { return {"number >= 0", 0.0, false}; }
/// 0 <= x < 1.
inline NumberRule unit_interval() { return {"number in [0, 1)", 0.0, false, 1.0, true}; }
/// 0 <= x <= 1.
inline NumberRule closed_unit_interval() { return {"number in [0, 1]", 0.0, false, 1.0, false}; }

/// The values one field accepts: how docs and messages describe them, and the reader and writer of the
/// field's type T.
template <class T>
struct ValueRule {
  /// Type and range for docs ("integer >= 0").
  std::string type;
  /// What a message says was expected ("an integer >= 0").
  std::string expected;
  /// The value as a T when it is one the rule allows, else nullopt.
  std::function<std::optional<T>(const ArgValue&)> parse;
  /// A T as a value (what parse reads back).
  std::function<ArgValue(const T&)> show;
};

/// The rules fields are bound with.
namespace rule {
/// A number (integers accepted) in `range`.
ValueRule<double> number(const NumberRule& range);
/// A number > 0, or inf (a norm's order).
ValueRule<double> positive_or_inf();
/// Two numbers, each in `range` (Adam's betas).
ValueRule<std::tuple<double, double>> number_pair(const NumberRule& range);
/// An integer in [lo, hi].
ValueRule<int64_t> integer(int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max());
/// true or false.
ValueRule<bool> boolean();
/// Any string.
ValueRule<std::string> text();
/// One of `choices`.
ValueRule<std::string> one_of(std::vector<std::string> choices);
/// A string that `allows` accepts; `type` and `expected` describe them.
ValueRule<std::string> text_where(std::string type, std::string expected,
                                  std::function<bool(const std::string&)> allows);
/// A number in `range` or a non-empty array of them (one per param group), held as an array.
ValueRule<std::vector<double>> numbers(const NumberRule& range);
/// An array (may be empty) of numbers, each in `range`.
ValueRule<std::vector<double>> number_array(const NumberRule& range);
/// An array of distinct strings, each one of `choices` (may be empty).
ValueRule<std::vector<std::string>> distinct_of(std::vector<std::string> choices);
/// An array of distinct strings that `allows` accepts (may be empty); `type` and `expected` describe them.
/// `allows` may throw std::invalid_argument to say why it refuses one.
ValueRule<std::vector<std::string>> distinct_where(std::string type, std::string expected,
                                                   std::function<bool(const std::string&)> allows);
/// A non-empty array of integers in [lo, hi].
ValueRule<std::vector<int64_t>> integers(int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max());
/// A number of seconds in `range`, held as milliseconds (truncated).
ValueRule<std::chrono::milliseconds> seconds(const NumberRule& range);
}  // namespace rule

/// One bound field of an `Owner` (an Options struct, or a config made of several), type-erased.
template <class Owner>
struct OptionField {
  /// Key ("warmup_gamma").
  std::string key;
  /// Type and range for docs.
  std::string type;
  /// What a message says was expected.
  std::string expected;
  /// Meaning, one line.
  std::string doc;
  /// Stores `value` into the field of `owner`; false (and `owner` unchanged) when the rule refuses it.
  std::function<bool(const ArgValue& value, Owner& owner)> read;
  /// The field's value in `owner`; nullopt when an optional field is unset.
  std::function<std::optional<ArgValue>(const Owner& owner)> show;
  /// A table without the key is refused ("<key> is required").
  bool required = false;
  /// What docs give as the default instead of the value in a default Owner ("required", "the run"); empty:
  /// the value.
  std::string default_text;
};

/// `"lr", [](auto& o) -> auto& { return o.lr(); }`: a TORCH_ARG field and its key, for OptionBinding::bind.
#define TRAINKIT_OPTION(field) #field, [](auto& o) -> auto& { return o.field(); }

/// The bound fields of `Owner`, in the order they are documented and printed.
template <class Owner>
class OptionBinding {
 public:
  /// Binds `field` (a callable returning a reference to a member of an Owner, const or not; see
  /// TRAINKIT_OPTION) to `key` under `rule`, whose type must be the field's. A field of type
  /// std::optional<T> takes a rule for T and is left out of printing while unset.
  template <class Field, class T>
  OptionBinding& bind(std::string key, Field field, ValueRule<T> rule, std::string doc) {
    using F = std::decay_t<decltype(field(std::declval<Owner&>()))>;
    constexpr bool optional = std::is_same_v<F, std::optional<T>>;
    static_assert(std::is_same_v<F, T> || optional, "OptionBinding::bind: the rule's type is not the field's");
    OptionField<Owner> f{std::move(key), rule.type, rule.expected, std::move(doc), {}, {}, false, ""};
    f.read = [field, parse = rule.parse](const ArgValue& value, Owner& owner) {
      auto x = parse(value);
      if (x) {
        field(owner) = std::move(*x);
      }
      return x.has_value();
    };
    f.show = [field, show = rule.show](const Owner& owner) -> std::optional<ArgValue> {
      const auto& value = field(owner);
      if constexpr (optional) {
        return value ? std::optional<ArgValue>(show(*value)) : std::nullopt;
      } else {
        return show(value);
      }
    };
    fields_.push_back(std::move(f));
    return *this;
  }

  /// Binds a field made of a key and a reader/writer pair already type-erased (a field whose value depends
  /// on several members).
  OptionBinding& bind(OptionField<Owner> field) {
    fields_.push_back(std::move(field));
    return *this;
  }

  /// Marks the field bound last as required: read_options refuses a table without its key.
  OptionBinding& required() {
    fields_.back().required = true;
    fields_.back().default_text = "required";
    return *this;
  }

  /// Gives the field bound last `text` as its default in docs (a default that depends on the run).
  OptionBinding& default_text(std::string text) {
    fields_.back().default_text = std::move(text);
    return *this;
  }

  /// Adds the fields of `inner` as fields of Owner, reached through `member` (a callable returning a
  /// reference to the Inner of an Owner, const or not): those named in `only` (all when empty), in
  /// `inner`'s order, each under its key in `inner` or the one `renamed` gives it.
  template <class Inner, class Member>
  OptionBinding& include(const OptionBinding<Inner>& inner, Member member, std::vector<std::string> only = {},
                         const std::map<std::string, std::string>& renamed = {}) {
    for (const auto& f : inner.fields()) {
      if (!only.empty() && std::find(only.begin(), only.end(), f.key) == only.end()) {
        continue;
      }
      const auto rename = renamed.find(f.key);
      OptionField<Owner> g{rename == renamed.end() ? f.key : rename->second,
                           f.type,
                           f.expected,
                           f.doc,
                           {},
                           {},
                           f.required,
                           f.default_text};
      g.read = [member, read = f.read](const ArgValue& value, Owner& owner) { return read(value, member(owner)); };
      g.show = [member, show = f.show](const Owner& owner) { return show(member(owner)); };
      fields_.push_back(std::move(g));
    }
    return *this;
  }

  /// The fields, in binding order.
  const std::vector<OptionField<Owner>>& fields() const { return fields_; }
  /// The field bound to `key`, or null.
  const OptionField<Owner>* find(const std::string& key) const {
    for (const auto& f : fields_) {
      if (f.key == key) {
        return &f;
      }
    }
    return nullptr;
  }
  /// The keys, in binding order.
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (const auto& f : fields_) {
      out.push_back(f.key);
    }
    return out;
  }

 private:
  std::vector<OptionField<Owner>> fields_;
};

/// Reads every key of `binding` present in `args` into `owner` (keys read before are left alone); an
/// unknown key is left for args.finish(). Throws ArgError "<where>: <key>: expected <what>, got <value>
/// (line N)" for a value the field's rule refuses, "<where>: <key> is required" for a missing required key.
template <class Owner>
void read_options(const OptionBinding<Owner>& binding, ArgReader& args, Owner& owner) {
  for (const auto& field : binding.fields()) {
    if (field.required && !args.has(field.key)) {
      args.fail_key(field.key, field.key + " is required");
    }
  }
  for (const std::string& key : args.unread()) {
    if (const auto* field = binding.find(key)) {
      if (!field->read(*find_arg(args.table(), key), owner)) {
        args.fail(key, field->expected);
      }
      args.ignore(key);
    }
  }
}

/// The value of every field of `binding` in `owner` (unset optional ones left out), in binding order.
template <class Owner>
ArgTable options_table(const OptionBinding<Owner>& binding, const Owner& owner) {
  ArgTable out;
  for (const auto& field : binding.fields()) {
    if (auto value = field.show(owner)) {
      out.emplace_back(field.key, std::move(*value));
    }
  }
  return out;
}

/// Checks every field of `owner` against its rule (an Options struct filled in code); throws ArgError
/// "<where>: <key>: expected <what>, got <value>" for the first one out of its range.
template <class Owner>
void check_options(const OptionBinding<Owner>& binding, const Owner& owner, const std::string& where) {
  for (const auto& field : binding.fields()) {
    const auto value = field.show(owner);
    Owner copy = owner;
    if (value && !field.read(*value, copy)) {
      throw ArgError(where + ": " + field.key + ": expected " + field.expected + ", got " + value->to_string(),
                     field.key);
    }
  }
}

}  // namespace trainkit
