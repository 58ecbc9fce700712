#include "trainkit/data/vocab.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace trainkit::data {

Vocab::Vocab(VocabOptions options) : options_(std::move(options)) {
  if (options_.min_freq() < 1) {
    throw std::invalid_argument(fmt::format("Vocab: min_freq must be >= 1, got {}", options_.min_freq()));
  }
  if (options_.max_tokens() < 0 || options_.max_tokens() == 1 || options_.max_tokens() == 2) {
    throw std::invalid_argument(fmt::format(
        "Vocab: max_tokens must be 0 (no limit) or > 2 (the two specials and at least one token), got {}",
        options_.max_tokens()));
  }
  if (options_.unk_token().empty() || options_.pad_token().empty() || options_.unk_token() == options_.pad_token()) {
    throw std::invalid_argument(fmt::format("Vocab: unk_token and pad_token must be distinct and non-empty, got "
                                            "\"{}\" and \"{}\"",
                                            options_.unk_token(), options_.pad_token()));
  }
  add(options_.unk_token());
  add(options_.pad_token());
}

Vocab::Vocab(const std::vector<std::vector<std::string>>& texts, VocabOptions options) : Vocab(std::move(options)) {
  std::unordered_map<std::string, int64_t> counts;
  for (const auto& text : texts) {
    for (const auto& token : text) {
      ++counts[token];
    }
  }
  counts.erase(options_.unk_token());
  counts.erase(options_.pad_token());
  std::vector<std::pair<std::string, int64_t>> kept;
  for (auto& [token, count] : counts) {
    if (count >= options_.min_freq()) {
      kept.emplace_back(token, count);
    }
  }
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (options_.max_tokens() > 0 && static_cast<int64_t>(kept.size()) > options_.max_tokens() - 2) {
    kept.resize(static_cast<size_t>(options_.max_tokens() - 2));
  }
  itos_.reserve(kept.size() + 2);
  for (const auto& entry : kept) {
    add(entry.first);
  }
}

Vocab Vocab::from_tokens(const std::vector<std::string>& tokens, VocabOptions options) {
  Vocab vocab(std::move(options));
  for (const auto& token : tokens) {
    if (vocab.contains(token)) {
      throw std::invalid_argument(fmt::format("Vocab::from_tokens: \"{}\" appears twice or is a special token",
                                              token));
    }
    vocab.add(token);
  }
  return vocab;
}

void Vocab::add(const std::string& token) {
  stoi_.emplace(token, static_cast<int64_t>(itos_.size()));
  itos_.push_back(token);
}

int64_t Vocab::index(const std::string& token) const {
  const auto it = stoi_.find(token);
  return it == stoi_.end() ? unk_index() : it->second;
}

const std::string& Vocab::token(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw std::out_of_range(fmt::format("Vocab::token: index {} is outside [0, {})", index, size()));
  }
  return itos_[static_cast<size_t>(index)];
}

std::vector<int64_t> Vocab::encode(const std::vector<std::string>& tokens) const {
  std::vector<int64_t> ids;
  ids.reserve(tokens.size());
  for (const auto& token : tokens) {
    ids.push_back(index(token));
  }
  return ids;
}

}  // namespace trainkit::data
