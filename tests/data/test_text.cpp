// Text data: the basic_english tokenizer against torchtext's rules (tests/golden/text.toml, written by
// scripts/golden_text.py), the vocabulary's order and limits, padding with lengths, the SequenceLoader's
// batches, and the fortunes and aclImdb readers on fixture files written here (sizes, labels, split,
// missing and unreadable files named).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/sequence_loader.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/data/text_datasets.h"
#include "trainkit/data/tokenizer.h"
#include "trainkit/data/vocab.h"

using namespace trainkit;
using trainkit::test::TempDir;
using trainkit::test::WhatContains;
namespace fs = std::filesystem;

namespace {

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::vector<std::string> strings(const toml::array& array) {
  std::vector<std::string> out;
  for (const auto& v : array) {
    out.push_back(v.value<std::string>().value());
  }
  return out;
}

}  // namespace

TEST_CASE("basic_english_tokenize equals torchtext's basic_english on the golden sentences", "[text][tokenizer]") {
  const auto& golden = test::golden("text.toml");
  const auto* cases = golden["case"].as_array();
  REQUIRE(cases != nullptr);
  REQUIRE(cases->size() >= 20);
  for (const auto& node : *cases) {
    const auto& c = *node.as_table();
    const std::string text = c["text"].value<std::string>().value();
    INFO("text: \"" << text << "\"");
    CHECK(data::basic_english_tokenize(text) == strings(*c["tokens"].as_array()));
  }
}

TEST_CASE("Vocab orders by frequency then token, applies min_freq and max_tokens", "[text][vocab]") {
  const std::vector<std::vector<std::string>> texts = {
      {"b", "a", "c", "a"}, {"c", "a", "d", "<pad>"}, {"b", "e", "c"}, {"<unk>"}};
  // counts: a 3, c 3, b 2, d 1, e 1 (the specials are not counted)
  SECTION("all tokens") {
    data::Vocab vocab(texts);
    CHECK(vocab.tokens() == std::vector<std::string>{"<unk>", "<pad>", "a", "c", "b", "d", "e"});
    CHECK(vocab.unk_index() == 0);
    CHECK(vocab.pad_index() == 1);
    CHECK(vocab.index("c") == 3);
    CHECK(vocab.index("never seen") == 0);
    CHECK(vocab.token(4) == "b");
    CHECK(vocab.encode({"e", "zzz", "a"}) == std::vector<int64_t>{6, 0, 2});
    CHECK_THROWS_AS(vocab.token(7), std::out_of_range);
  }
  SECTION("min_freq") {
    data::Vocab vocab(texts, data::VocabOptions().min_freq(2));
    CHECK(vocab.tokens() == std::vector<std::string>{"<unk>", "<pad>", "a", "c", "b"});
    CHECK(vocab.index("d") == vocab.unk_index());
  }
  SECTION("max_tokens counts the specials") {
    data::Vocab vocab(texts, data::VocabOptions().max_tokens(4));
    CHECK(vocab.tokens() == std::vector<std::string>{"<unk>", "<pad>", "a", "c"});
  }
  SECTION("the order does not depend on the order of the texts") {
    auto reversed = texts;
    std::reverse(reversed.begin(), reversed.end());
    CHECK(data::Vocab(reversed).tokens() == data::Vocab(texts).tokens());
  }
  SECTION("from_tokens and invalid options") {
    const auto vocab = data::Vocab::from_tokens({"x", "y"});
    CHECK(vocab.tokens() == std::vector<std::string>{"<unk>", "<pad>", "x", "y"});
    CHECK_THROWS_MATCHES(data::Vocab::from_tokens({"x", "x"}), std::invalid_argument, WhatContains("\"x\""));
    CHECK_THROWS_MATCHES(data::Vocab(texts, data::VocabOptions().min_freq(0)), std::invalid_argument,
                         WhatContains("min_freq must be >= 1, got 0"));
    CHECK_THROWS_MATCHES(data::Vocab(texts, data::VocabOptions().max_tokens(2)), std::invalid_argument,
                         WhatContains("got 2"));
  }
}

TEST_CASE("pad_sequences pads batch-first with lengths and truncates", "[text][padding]") {
  const auto padded = data::pad_sequences({{5, 6, 7}, {8}, {}, {9, 10}}, 1);
  CHECK(padded.tokens.equal(torch::tensor({5, 6, 7, 8, 1, 1, 1, 1, 1, 9, 10, 1}, torch::kLong).view({4, 3})));
  CHECK(padded.lengths.equal(torch::tensor({3, 1, 1, 2}, torch::kLong)));
  const auto truncated = data::pad_sequences({{5, 6, 7}, {8}}, 0, 2);
  CHECK(truncated.tokens.equal(torch::tensor({5, 6, 8, 0}, torch::kLong).view({2, 2})));
  CHECK(truncated.lengths.equal(torch::tensor({2, 1}, torch::kLong)));
  CHECK_THROWS_AS(data::pad_sequences({}, 0), std::invalid_argument);
}

TEST_CASE("SequenceLoader yields every sequence once per epoch, padded per batch, replayable", "[text][padding]") {
  std::vector<std::vector<int64_t>> seqs;
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 10; ++i) {
    seqs.push_back(std::vector<int64_t>(static_cast<size_t>(i % 4 + 1), i + 2));  // sample i is (i+2) repeated
    labels.push_back(i % 3);
  }
  data::SequenceLoader loader(seqs, labels, data::SequenceLoaderOptions().batch_size(4).seed(3).pad_index(1));
  CHECK(loader.num_batches() == 3);
  const auto read_epoch = [&](int64_t epoch) {
    loader.set_epoch(epoch);
    std::vector<int64_t> order;
    while (auto b = loader.next()) {
      const auto& tokens = b->input("tokens");
      const auto& lengths = b->input("lengths");
      REQUIRE(tokens.size(1) == lengths.max().item<int64_t>());
      for (int64_t r = 0; r < tokens.size(0); ++r) {
        const int64_t sample = tokens[r][0].item<int64_t>() - 2;
        order.push_back(sample);
        CHECK(lengths[r].item<int64_t>() == sample % 4 + 1);
        CHECK(b->target()[r].item<int64_t>() == sample % 3);
        CHECK(tokens[r].slice(0, lengths[r].item<int64_t>()).eq(1).all().item<bool>());
      }
    }
    return order;
  };
  const auto e0 = read_epoch(0);
  const auto e1 = read_epoch(1);
  CHECK(std::set<int64_t>(e0.begin(), e0.end()).size() == 10);
  CHECK(e0 != e1);
  CHECK(read_epoch(0) == e0);
  CHECK_THROWS_AS(data::SequenceLoader(seqs, {0, 1}), std::invalid_argument);
}

TEST_CASE("SequenceLoader shards an epoch as TensorLoader does with the same sampler options", "[text][padding]") {
  std::vector<std::vector<int64_t>> seqs;
  for (int64_t i = 0; i < 11; ++i) {
    seqs.push_back({i + 2});  // sample i is the token i + 2
  }
  const std::vector<int64_t> labels(seqs.size(), 0);
  const at::Tensor ids = torch::arange(11);
  // One sampler setting, given to both loaders.
  const auto order = [](auto options, int64_t rank) { return options.batch_size(2).seed(5).num_replicas(3).rank(rank); };
  std::set<int64_t> seen;
  for (int64_t rank = 0; rank < 3; ++rank) {
    data::SequenceLoader text(seqs, labels, order(data::SequenceLoaderOptions(), rank));
    data::TensorLoader tensors(ids, ids, order(data::TensorLoaderOptions(), rank));
    CHECK(text.num_batches() == tensors.num_batches());
    text.set_epoch(2);
    tensors.set_epoch(2);
    while (auto b = text.next()) {
      const auto t = tensors.next();
      REQUIRE(t);
      CHECK(torch::equal(b->input("tokens").select(1, 0) - 2, t->input()));
      for (int64_t r = 0; r < t->input().size(0); ++r) {
        seen.insert(t->input()[r].item<int64_t>());
      }
    }
    CHECK_FALSE(tensors.next());
  }
  CHECK(seen.size() == 11);  // the shards cover the epoch
  CHECK_THROWS_AS(data::SequenceLoader(seqs, labels, data::SequenceLoaderOptions().num_replicas(2).rank(2)),
                  std::invalid_argument);
}

TEST_CASE("read_fortunes: one class per fortune file, records split at % lines", "[text][fortunes]") {
  TempDir tmp("fortunes");
  const fs::path dir = tmp.path();
  write_file(dir / "zoo", "A lion.\n%\nTwo\nlines.\n%\n%\nlast one, no final percent\n");
  write_file(dir / "art", "Art is long.\n%\nLife is short.\n%\n");
  write_file(dir / "tiny", "only one\n%\n");
  write_file(dir / "art.dat", "binary index, ignored");
  write_file(dir / "off" / "rude", "left out\n%\n");
  write_file(dir / ".hidden", "left out\n%\n");
  fs::create_symlink("art", dir / "art.u8");

  CHECK(data::read_fortune_file((dir / "zoo").string()) ==
        std::vector<std::string>{"A lion.", "Two\nlines.", "last one, no final percent"});

  const auto all = data::read_fortunes(dir.string());
  CHECK(all.classes == std::vector<std::string>{"art", "tiny", "zoo"});
  CHECK(all.size() == 6);
  CHECK(all.class_counts() == std::vector<int64_t>{2, 1, 3});
  CHECK(all.texts[0] == "Art is long.");
  CHECK(all.labels == std::vector<int64_t>{0, 0, 1, 2, 2, 2});

  const auto some = data::read_fortunes(dir.string(), data::FortunesOptions().min_records(2));
  CHECK(some.classes == std::vector<std::string>{"art", "zoo"});
  CHECK(some.labels == std::vector<int64_t>{0, 0, 1, 1, 1});
  const auto named = data::read_fortunes(dir.string(), data::FortunesOptions().classes({"zoo", "art"}));
  CHECK(named.classes == std::vector<std::string>{"zoo", "art"});
  CHECK(named.class_counts() == std::vector<int64_t>{3, 2});

  CHECK_THROWS_MATCHES(data::read_fortunes((dir / "nope").string()), data::DataError,
                       WhatContains((dir / "nope").string() + ": no such directory"));
  CHECK_THROWS_MATCHES(data::read_fortunes(dir.string(), data::FortunesOptions().classes({"art", "missing"})),
                       data::DataError, WhatContains((dir / "missing").string() + ": cannot open"));
  CHECK_THROWS_MATCHES(data::read_fortunes(dir.string(), data::FortunesOptions().min_records(10)), data::DataError,
                       WhatContains("no fortune files with at least 10 records"));
}

TEST_CASE("stratified_split keeps every class's share and is fixed by the seed", "[text][fortunes]") {
  data::TextSet set;
  set.classes = {"a", "b", "c"};
  const int64_t counts[] = {50, 20, 3};
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < counts[c]; ++i) {
      set.texts.push_back(set.classes[static_cast<size_t>(c)] + std::to_string(i));
      set.labels.push_back(c);
    }
  }
  const auto split = data::stratified_split(set, 0.2, 7);
  CHECK(split.test.class_counts() == std::vector<int64_t>{10, 4, 1});
  CHECK(split.train.class_counts() == std::vector<int64_t>{40, 16, 2});
  std::set<std::string> seen(split.train.texts.begin(), split.train.texts.end());
  seen.insert(split.test.texts.begin(), split.test.texts.end());
  CHECK(seen.size() == 73);
  CHECK(data::stratified_split(set, 0.2, 7).test.texts == split.test.texts);
  CHECK(data::stratified_split(set, 0.2, 8).test.texts != split.test.texts);
  CHECK_THROWS_AS(data::stratified_split(set, 1.0, 0), std::invalid_argument);
}

TEST_CASE("read_aclimdb reads train/test pos/neg folders with labels from the folder", "[text][imdb]") {
  TempDir tmp("aclimdb");
  const fs::path dir = tmp.path() / "aclImdb";
  write_file(dir / "train" / "pos" / "0_9.txt", "Great film.<br /><br />Loved it.");
  write_file(dir / "train" / "pos" / "1_7.txt", "Good.");
  write_file(dir / "train" / "pos" / "10_8.txt", "Fine.");
  write_file(dir / "train" / "neg" / "2_1.txt", "Awful.");
  write_file(dir / "train" / "unsup" / "3_0.txt", "ignored");
  write_file(dir / "train" / "labeledBow.feat", "ignored");
  write_file(dir / "test" / "pos" / "4_10.txt", "Wonderful!");
  write_file(dir / "test" / "neg" / "5_2.txt", "Boring.");
  write_file(dir / "test" / "neg" / "6_3.txt", "Dull.");
  write_file(dir / "test" / "neg" / "notes.md", "not a review");

  const auto imdb = data::read_aclimdb(dir.string());
  CHECK(imdb.train.classes == std::vector<std::string>{"neg", "pos"});
  CHECK(imdb.train.size() == 4);
  CHECK(imdb.test.size() == 3);
  CHECK(imdb.train.labels == std::vector<int64_t>{0, 1, 1, 1});
  // File-name (byte) order: 0_9 < 10_8 < 1_7.
  CHECK(imdb.train.texts == std::vector<std::string>{"Awful.", "Great film.<br /><br />Loved it.", "Fine.", "Good."});
  CHECK(imdb.test.class_counts() == std::vector<int64_t>{2, 1});
  CHECK(imdb.test.texts[0] == "Boring.");

  SECTION("a missing folder is named") {
    fs::remove_all(dir / "test" / "pos");
    CHECK_THROWS_MATCHES(data::read_aclimdb(dir.string()), data::DataError,
                         WhatContains((dir / "test" / "pos").string() + ": no such directory"));
  }
  SECTION("a folder without reviews is named") {
    fs::remove(dir / "train" / "neg" / "2_1.txt");
    CHECK_THROWS_MATCHES(data::read_aclimdb(dir.string()), data::DataError,
                         WhatContains((dir / "train" / "neg").string() + ": no .txt files"));
  }
  SECTION("an unreadable review is named") {
    // A dangling link (a permission bit would not stop a test running as root).
    fs::create_symlink(tmp.path() / "gone.txt", dir / "train" / "pos" / "11_9.txt");
    CHECK_THROWS_MATCHES(data::read_aclimdb(dir.string()), data::DataError,
                         WhatContains((dir / "train" / "pos" / "11_9.txt").string() + ": cannot open"));
  }
  SECTION("a folder named like a review is named") {
    fs::create_directories(dir / "test" / "neg" / "7_1.txt");
    CHECK_THROWS_MATCHES(data::read_aclimdb(dir.string()), data::DataError,
                         WhatContains((dir / "test" / "neg" / "7_1.txt").string() + ": cannot read: not a regular file"));
  }
}
