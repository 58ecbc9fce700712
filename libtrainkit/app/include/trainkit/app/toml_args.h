#pragma once
/// @file
/// TOML text to trainkit's format-neutral named arguments (trainkit/args.h) and back: the one place the
/// application layer reads TOML for the optimizer and scheduler factories.

#include <string>

#include "trainkit/args.h"

namespace trainkit::app {

/// Parses TOML text into an ArgTable (tables nested, source lines kept). A syntax error throws ArgError
/// "<source>: TOML syntax error at line L, column C: ...".
ArgTable parse_toml(const std::string& text, const std::string& source);

/// Parses one `--set` value: TOML syntax (numbers, booleans, arrays, quoted strings), anything else is
/// taken as a bare string.
ArgValue parse_toml_value(const std::string& text);

/// The entries of `table` as TOML `key = value` lines (nested tables and arrays inline), which
/// parse_toml reads back to the same values.
std::string to_toml_lines(const ArgTable& table);

}  // namespace trainkit::app
