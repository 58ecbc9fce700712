#pragma once
/// @file
/// A token vocabulary built from tokenized texts, as torchtext's `build_vocab_from_iterator(iterator,
/// min_freq, specials=["<unk>", "<pad>"], special_first=True, max_tokens)` with `set_default_index(<unk>)`:
///
///   data::Vocab vocab(train_tokens, data::VocabOptions().min_freq(2).max_tokens(20000));
///   std::vector<int64_t> ids = vocab.encode(data::basic_english_tokenize(text));

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/arg.h>

namespace trainkit::data {

/// Options of a Vocab.
struct VocabOptions {
  /// Tokens seen fewer times than this are left out (map to `<unk>`).
  TORCH_ARG(int64_t, min_freq) = 1;
  /// At most this many entries, the two specials included (0 = no limit): the most frequent tokens win.
  TORCH_ARG(int64_t, max_tokens) = 0;
  /// The unknown token, index 0.
  TORCH_ARG(std::string, unk_token) = "<unk>";
  /// The padding token, index 1.
  TORCH_ARG(std::string, pad_token) = "<pad>";
};

/// Token ↔ index. Index 0 is `<unk>`, 1 is `<pad>`, then the tokens by frequency (descending), ties by
/// token (byte order, which for UTF-8 is code point order, as Python sorts strings): the order depends
/// only on the counts, never on the order texts were read in.
class Vocab {
 public:
  /// Counts every token of `texts` (each a tokenized text) and keeps those with count >= min_freq, at most
  /// max_tokens - 2 of them. Occurrences of the special tokens themselves are not counted. Throws
  /// std::invalid_argument for min_freq < 1, max_tokens in [1, 2] or empty/equal special tokens.
  explicit Vocab(const std::vector<std::vector<std::string>>& texts, VocabOptions options = {});
  /// A vocabulary of exactly these tokens, in this order after the two specials (e.g. one saved with
  /// tokens()). Throws std::invalid_argument for a duplicate token or one equal to a special.
  static Vocab from_tokens(const std::vector<std::string>& tokens, VocabOptions options = {});

  /// Entries, the specials included.
  int64_t size() const { return static_cast<int64_t>(itos_.size()); }
  /// Index of `token`, unk_index() when it is not in the vocabulary.
  int64_t index(const std::string& token) const;
  /// The token at `index`; throws std::out_of_range for an index outside [0, size()).
  const std::string& token(int64_t index) const;
  /// Whether `token` has an index of its own.
  bool contains(const std::string& token) const { return stoi_.count(token) != 0; }
  /// Index of the unknown token (0).
  int64_t unk_index() const { return 0; }
  /// Index of the padding token (1).
  int64_t pad_index() const { return 1; }
  /// The indices of `tokens` (unk_index() for unknown ones).
  std::vector<int64_t> encode(const std::vector<std::string>& tokens) const;
  /// Every entry in index order, the specials first (torchtext's `get_itos()`).
  const std::vector<std::string>& tokens() const { return itos_; }
  /// The options it was built with.
  const VocabOptions& options() const { return options_; }

 private:
  explicit Vocab(VocabOptions options);
  void add(const std::string& token);

  VocabOptions options_;
  std::vector<std::string> itos_;
  std::unordered_map<std::string, int64_t> stoi_;
};

}  // namespace trainkit::data
