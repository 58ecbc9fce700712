#pragma once
/// @file
/// The command-line parser of trainkit's CLI, apps and benchmarks: a small facade over CLI11, which is
/// compiled once, in cli.cpp, instead of in every program (it is header only and took about 15 s of each
/// program's compile). Help text, error messages and exit codes are CLI11's.
///
///     trainkit::app::Cli cli{"What the program does"};
///     int64_t steps = 200;
///     cli.option("--steps", steps, "Optimizer steps").show_default().positive();
///     if (auto rc = cli.parse(argc, argv)) return *rc;

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace trainkit::app {

/// One option of a Cli; its rules chain: `cli.option(...).show_default().range(1, 100)`. A rule is checked
/// on every value given on the command line (each element of a vector option), before the value is stored;
/// a value that breaks it fails the parse with a message naming the option.
class CliOption {
 public:
  /// The value must be a number > 0 (CLI11's PositiveNumber).
  CliOption& positive();
  /// The value must be a number >= 0 (CLI11's NonNegativeNumber).
  CliOption& non_negative();
  /// The value must be an integer in [lo, hi] (CLI11's Range; help shows "INT in [lo - hi]").
  CliOption& range(int64_t lo, int64_t hi);
  /// As range(int64_t, int64_t), for call sites that write int literals.
  CliOption& range(int lo, int hi);
  /// The value must be a number in [lo, hi] (help shows "FLOAT in [lo - hi]").
  CliOption& range(double lo, double hi);
  /// The value must be one of `choices`, compared exactly (CLI11's IsMember).
  CliOption& one_of(const std::vector<std::string>& choices);
  /// The option must be given (for a positional, at least one value).
  CliOption& required();
  /// The help shows the target's value at the time of this call as the default (`--steps INT=200`; a
  /// vector's values as they are typed, separated by spaces: `--sizes INT=32 64 ...`).
  CliOption& show_default();
  /// A vector option also splits each value at `separator`: `--sizes 1,2,3` is `--sizes 1 2 3`.
  CliOption& delimiter(char separator);

 private:
  friend class Cli;
  struct Ref;
  explicit CliOption(Ref* ref) : ref_(ref) {}
  Ref* ref_;
};

/// A command-line parser: options bound to variables, flags, positionals and subcommands. An option's
/// name starting with "-" is named ("--steps", "-n,--steps"); any other name is a positional ("files").
/// A variable keeps its value when its option is absent, so its initializer is the default; a vector
/// option's given values replace the initial ones, and repeating the option appends. The help names each
/// value's type (INT, UINT, FLOAT, TEXT). Not copyable: the options refer to the variables, subcommands to
/// their parent.
class Cli {
 public:
  /// A parser whose help starts with `description`.
  explicit Cli(const std::string& description);
  ~Cli();
  Cli(const Cli&) = delete;
  Cli& operator=(const Cli&) = delete;

  /// Binds `--name VALUE` to `target`.
  CliOption option(const std::string& name, int& target, const std::string& help);
  /// Binds `--name VALUE` to `target`.
  CliOption option(const std::string& name, int64_t& target, const std::string& help);
  /// Binds `--name VALUE` to `target`.
  CliOption option(const std::string& name, uint64_t& target, const std::string& help);
  /// Binds `--name VALUE` to `target`.
  CliOption option(const std::string& name, double& target, const std::string& help);
  /// Binds `--name VALUE` to `target`; VALUE is true/false, 1/0, yes/no or on/off (a flag takes none).
  CliOption option(const std::string& name, bool& target, const std::string& help);
  /// Binds `--name VALUE` to `target`.
  CliOption option(const std::string& name, std::string& target, const std::string& help);
  /// Binds `--name V1 V2 ...` to `target`.
  CliOption option(const std::string& name, std::vector<std::string>& target, const std::string& help);
  /// Binds `--name V1 V2 ...` to `target`.
  CliOption option(const std::string& name, std::vector<int64_t>& target, const std::string& help);
  /// Binds `--name V1 V2 ...` to `target`.
  CliOption option(const std::string& name, std::vector<double>& target, const std::string& help);
  /// Binds the flag `--name` (no value) to `target`: true when given.
  CliOption flag(const std::string& name, bool& target, const std::string& help);

  /// Adds a subcommand (`trainkit train ...`) with its own options; it lives as long as this parser.
  Cli& subcommand(const std::string& name, const std::string& help);
  /// Exactly one subcommand must be given.
  Cli& require_subcommand();
  /// Whether this subcommand was given on the command line (after parse() on the top parser).
  bool parsed() const;

  /// Parses the command line and stores the values; nothing on success. Otherwise prints the help (to
  /// stdout) or the error and "Run with --help for more information." (to stderr) and returns the code
  /// main should return: 0 after --help, CLI11's non-zero code after an error (104 for a value that is
  /// not of the option's type, 105 for one a rule rejects, 106 for a missing required option, 109 for an
  /// unknown argument, ...). Use: `if (auto rc = cli.parse(argc, argv)) return *rc;`.
  std::optional<int> parse(int argc, const char* const* argv);
  /// As parse(argc, argv), printing the help to `out` and errors to `err`.
  std::optional<int> parse(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

 private:
  struct Impl;
  explicit Cli(std::unique_ptr<Impl> impl);
  template <typename T>
  CliOption add_option(const std::string& name, T& target, const std::string& help);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainkit::app
