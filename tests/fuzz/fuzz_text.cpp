// Fuzz target `fortunes`: data::read_fortune_file over raw bytes, then the basic_english tokenizer and a
// Vocab built from the records (the path of the text case study).

#include <string>
#include <vector>

#include "fuzz_target.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/text_datasets.h"
#include "trainkit/data/tokenizer.h"
#include "trainkit/data/vocab.h"

TRAINKIT_FUZZ_TARGET(fortunes) {
  const std::string path = trainkit::fuzz::scratch_file(data, size, "fortunes");
  std::vector<std::string> records;
  try {
    records = trainkit::data::read_fortune_file(path);
  } catch (const trainkit::data::DataError&) {
    return 0;
  }
  std::vector<std::vector<std::string>> tokenized;
  for (const auto& record : records) {
    trainkit::fuzz::check(!record.empty(), "an empty record was returned");
    // No line of a record is a separator ("%" or "%\r"), except that the last line is shown with its
    // trailing CRs trimmed (a last line "%\r\r" is not a separator, yet reads "%").
    size_t begin = 0;
    for (size_t end = record.find('\n'); end != std::string::npos; end = record.find('\n', begin)) {
      const std::string line = record.substr(begin, end - begin);
      trainkit::fuzz::check(line != "%" && line != "%\r", "a record holds a separator line");
      begin = end + 1;
    }
    tokenized.push_back(trainkit::data::basic_english_tokenize(record));
  }
  const trainkit::data::Vocab vocab(tokenized);
  for (const auto& tokens : tokenized) {
    const std::vector<int64_t> ids = vocab.encode(tokens);
    trainkit::fuzz::check(ids.size() == tokens.size(), "encode changed the number of tokens");
    for (size_t i = 0; i < ids.size(); ++i) {
      trainkit::fuzz::check(ids[i] >= 0 && ids[i] < vocab.size(), "token index out of range");
      const bool special = tokens[i] == "<unk>" || tokens[i] == "<pad>";
      trainkit::fuzz::check(special || vocab.token(ids[i]) == tokens[i], "token -> index -> token differs");
    }
  }
  return 0;
}
