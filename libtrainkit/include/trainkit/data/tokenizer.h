#pragma once
/// @file
/// torchtext's `basic_english` tokenizer (`torchtext.data.utils.get_tokenizer("basic_english")`):
///
///   data::basic_english_tokenize("You can't stop<br />me, \"ok\"?")
///   // {"you", "can", "'", "t", "stop", "me", ",", "ok", "?"}

#include <string>
#include <vector>

namespace trainkit::data {

/// Splits a line of UTF-8 text into tokens with torchtext's `basic_english` rules, applied in this order
/// after lowercasing: `'` → ` '  `, `"` → removed, `.` → ` . `, `<br />` → ` `, `,` → ` , `, `(` → ` ( `,
/// `)` → ` ) `, `!` → ` ! `, `?` → ` ? `, `;` → ` `, `:` → ` `, then a split on whitespace.
///
/// As in Python, whitespace is Unicode's (ASCII space, \t \n \v \f \r, \x1c-\x1f, U+0085, U+00A0,
/// U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000). Lowercasing covers ASCII and the
/// Latin-1 capitals U+00C0-U+00DE; other non-ASCII letters pass unchanged (Python's str.lower() would
/// lowercase Greek or Cyrillic too). Invalid UTF-8 bytes pass unchanged.
std::vector<std::string> basic_english_tokenize(const std::string& line);

}  // namespace trainkit::data
