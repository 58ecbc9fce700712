#include "trainkit/data/tokenizer.h"

#include <cstddef>
#include <cstdint>

namespace trainkit::data {
namespace {

/// Bytes of the whitespace character that starts at `s[i]` (Python's str.isspace), 0 when it is not one.
size_t whitespace_at(const std::string& s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b == ' ' || (b >= 0x09 && b <= 0x0d) || (b >= 0x1c && b <= 0x1f)) {
    return 1;
  }
  const auto at = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  if (b == 0xc2 && (at(1) == 0x85 || at(1) == 0xa0)) {  // U+0085, U+00A0
    return 2;
  }
  if (b == 0xe1 && at(1) == 0x9a && at(2) == 0x80) {  // U+1680
    return 3;
  }
  if (b == 0xe2 && at(1) == 0x80) {  // U+2000-U+200A, U+2028, U+2029, U+202F
    const unsigned c = at(2);
    if ((c >= 0x80 && c <= 0x8a) || c == 0xa8 || c == 0xa9 || c == 0xaf) {
      return 3;
    }
  }
  if (b == 0xe2 && at(1) == 0x81 && at(2) == 0x9f) {  // U+205F
    return 3;
  }
  if (b == 0xe3 && at(1) == 0x80 && at(2) == 0x80) {  // U+3000
    return 3;
  }
  return 0;
}

/// ASCII and Latin-1 capitals (U+00C0-U+00DE but U+00D7) to lower case.
std::string lowercase(const std::string& line) {
  std::string out = line;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto b = static_cast<unsigned char>(out[i]);
    if (b >= 'A' && b <= 'Z') {
      out[i] = static_cast<char>(b - 'A' + 'a');
    } else if (b == 0xc3 && i + 1 < out.size()) {
      const auto c = static_cast<unsigned char>(out[i + 1]);
      if (c >= 0x80 && c <= 0x9e && c != 0x97) {
        out[i + 1] = static_cast<char>(c + 0x20);
      }
      ++i;
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> basic_english_tokenize(const std::string& line) {
  // The rules are torchtext's sequence of regex substitutions. Every rule but `<br />` maps one character
  // to itself padded with spaces (or to a space, or to nothing), and none of their outputs can create a
  // character another single-character rule matches; only the removal of `"` can join a `<br />` (as in
  // `<br "/>`). So: lowercase, drop `"`, replace `<br />`, then pad or blank the single characters while
  // splitting on whitespace in one pass. Padding `'` and `.` before `<br />` changes nothing: `<br />`
  // contains neither.
  std::string text;
  text.reserve(line.size());
  for (char c : lowercase(line)) {
    if (c != '"') {
      text.push_back(c);
    }
  }
  static const std::string kBreak = "<br />";
  std::string joined;
  joined.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kBreak.size(), kBreak) == 0) {
      joined.push_back(' ');
      i += kBreak.size();
    } else {
      joined.push_back(text[i++]);
    }
  }
  std::vector<std::string> tokens;
  std::string token;
  const auto flush = [&] {
    if (!token.empty()) {
      tokens.push_back(std::move(token));
      token.clear();
    }
  };
  for (size_t i = 0; i < joined.size();) {
    if (const size_t ws = whitespace_at(joined, i)) {
      flush();
      i += ws;
      continue;
    }
    const char c = joined[i++];
    switch (c) {
      case '\'':
      case '.':
      case ',':
      case '(':
      case ')':
      case '!':
      case '?':
        flush();
        tokens.emplace_back(1, c);
        break;
      case ';':
      case ':':
        flush();
        break;
      default:
        token.push_back(c);
    }
  }
  flush();
  return tokens;
}

}  // namespace trainkit::data
