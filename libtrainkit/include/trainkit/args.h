#pragma once
/// @file
/// Named arguments, independent of any file format: the optimizer and scheduler factories read their
/// arguments (PyTorch's names: `lr`, `betas`, `T_max` ...) from an ArgTable through one ArgReader. The
/// application layer fills ArgTables from TOML; a program can also build one in code.
///
/// Error policy (the whole library): a caller's invalid argument throws `std::invalid_argument` (ArgError
/// for named arguments) whose message names the argument and echoes its value; a problem with the outside
/// world (a file, a peer rank) throws a typed `std::runtime_error` subclass of its area that names the file
/// or rank (data::DataError, train::CheckpointError, dist::DistError ...); misuse of an object's protocol
/// (calls out of order) throws `std::logic_error`. LibTorch's own `c10::Error` passes through unchanged.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace trainkit {

/// An invalid named argument: unknown key, wrong type, out-of-range or missing value. what() names
/// where the table came from (a file, `--set`, code), the key and what was expected.
class ArgError : public std::invalid_argument {
 public:
  /// `key`: the top-level key of the table the error is about, when it is about one.
  explicit ArgError(const std::string& message, std::string key = "")
      : std::invalid_argument(message), key_(std::move(key)) {}
  /// The key the error is about ("" when it is about the table as a whole), so that a caller who merged
  /// the table from several places (a file and `--set`) can name the right one.
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

class ArgValue;

/// An ordered table of named values (order kept for messages and printing).
using ArgTable = std::vector<std::pair<std::string, ArgValue>>;

/// One value: a boolean, integer, number, string, array or table, with the source line it came from.
class ArgValue {
 public:
  using Array = std::vector<ArgValue>;
  using Variant = std::variant<bool, int64_t, double, std::string, Array, ArgTable>;

  ArgValue(bool v, int line = 0) : value_(v), line_(line) {}  // NOLINT(google-explicit-constructor)
  ArgValue(int v, int line = 0) : value_(int64_t{v}), line_(line) {}  // NOLINT(google-explicit-constructor)
  ArgValue(int64_t v, int line = 0) : value_(v), line_(line) {}  // NOLINT(google-explicit-constructor)
  ArgValue(double v, int line = 0) : value_(v), line_(line) {}  // NOLINT(google-explicit-constructor)
  ArgValue(std::string v, int line = 0) : value_(std::move(v)), line_(line) {}  // NOLINT(google-explicit-constructor)
  ArgValue(const char* v, int line = 0) : value_(std::string(v)), line_(line) {}  // NOLINT(google-explicit-constructor)
  ArgValue(Array v, int line = 0) : value_(std::move(v)), line_(line) {}  // NOLINT(google-explicit-constructor)
  ArgValue(ArgTable v, int line = 0) : value_(std::move(v)), line_(line) {}  // NOLINT(google-explicit-constructor)

  const Variant& value() const { return value_; }
  /// Source line (1-based), 0 when unknown.
  int line() const { return line_; }

  template <class T>
  const T* get_if() const {
    return std::get_if<T>(&value_);
  }
  template <class T>
  T* get_if() {
    return std::get_if<T>(&value_);
  }
  /// A number: a double, or an integer converted.
  std::optional<double> as_number() const;

  /// The value as TOML-like text: `true`, `3`, `0.001`, `"adam"`, `[0.9, 0.999]`, `{ a = 1 }`.
  std::string to_string() const;

 private:
  Variant value_;
  int line_ = 0;
};

/// The value of `key` in `table`, or null.
const ArgValue* find_arg(const ArgTable& table, const std::string& key);
/// The value of `key` in `table`, or null (to change it in place).
ArgValue* find_arg(ArgTable& table, const std::string& key);
/// Refused: the pointer would outlive the temporary table it points into.
const ArgValue* find_arg(ArgTable&& table, const std::string& key) = delete;
/// Sets `key` to `value`, replacing an existing entry in place or appending.
void set_arg(ArgTable& table, const std::string& key, ArgValue value);

/// Reads typed values from one ArgTable and remembers which keys were read, so that finish() can reject
/// the rest. Every error is an ArgError "<where>: <key>: expected <what>, got <value> (line N)".
class ArgReader {
 public:
  /// `where` names the table in messages, e.g. "train.toml: [scheduler]".
  ArgReader(const ArgTable& table, std::string where);

  const std::string& where() const { return where_; }
  const ArgTable& table() const { return *table_; }
  /// True when `key` is present (does not mark it read).
  bool has(const std::string& key) const;

  /// An integer.
  std::optional<int64_t> integer(const std::string& key);
  /// A number (integers accepted).
  std::optional<double> number(const std::string& key);
  /// true or false.
  std::optional<bool> boolean(const std::string& key);
  /// A string.
  std::optional<std::string> string(const std::string& key);
  /// A number, or a non-empty array of numbers (e.g. one per param group).
  std::optional<std::vector<double>> numbers(const std::string& key);
  /// An array of integers.
  std::optional<std::vector<int64_t>> integers(const std::string& key);
  /// A non-empty array of tables (TOML's `[[key]]`), each read by its own reader named `where.key[i]`.
  std::optional<std::vector<ArgReader>> tables(const std::string& key);

  int64_t required_integer(const std::string& key);
  double required_number(const std::string& key);
  std::string required_string(const std::string& key);
  std::vector<double> required_numbers(const std::string& key);
  std::vector<int64_t> required_integers(const std::string& key);
  std::vector<ArgReader> required_tables(const std::string& key);

  /// Marks `key` as known without reading it (a key another layer consumes).
  void ignore(const std::string& key);
  /// The keys present that were neither read nor ignored so far, in table order.
  std::vector<std::string> unread() const;
  /// Throws ArgError for the first key that was never read: "<where>: unknown key 'k' for <what>
  /// (known: ...)".
  void finish(const std::string& what) const;

  /// Throws "<where>: <key>: expected <expected>, got <value> (line N)".
  [[noreturn]] void fail(const std::string& key, const std::string& expected) const;
  /// Throws "<where>: <message>".
  [[noreturn]] void fail(const std::string& message) const;
  /// Throws "<where>: <message>" about `key` (ArgError::key()).
  [[noreturn]] void fail_key(const std::string& key, const std::string& message) const;

 private:
  const ArgValue* use(const std::string& key);
  [[noreturn]] void missing(const std::string& key) const;

  const ArgTable* table_;
  std::string where_;
  std::vector<std::string> used_;  // keys read so far, in reading order: the known keys
};

}  // namespace trainkit
