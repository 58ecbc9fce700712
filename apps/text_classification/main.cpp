// text_classification: the LR notes' text case study, trained by the same Config, build_run and train job as
// `trainkit train`. This file adds two providers to the catalog, with their config keys: the texts (Debian's
// fortunes, one class per fortune file, or the aclImdb reviews), tokenized with torchtext's basic_english
// rules, encoded with the training split's vocabulary and padded per batch with their lengths; and the models,
// an embedding + LSTM (run on pack_padded_sequence) + linear classifier and a bag-of-words logistic
// regression. The run directory (config.toml, metrics, checkpoints, summary.json, --resume) is the train
// job's. The LSTM's test accuracy is reported against the majority class and against the bag-of-words model,
// trained by the same job in <out>/baseline ([baseline]).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/jobs.h"
#include "trainkit/app/main.h"
#include "trainkit/app/providers.h"
#include "trainkit/data.h"
#include "trainkit/nn.h"
#include "trainkit/options.h"

namespace {

namespace tk = trainkit;
namespace app = trainkit::app;

// ---- the data provider ----------------------------------------------------------------------------------

/// The text data sets' own `[data]` keys.
struct TextDataOptions {
  TORCH_ARG(int64_t, min_records) = 50;
  TORCH_ARG(double, test_fraction) = 0.2;
  TORCH_ARG(int64_t, split_seed) = 0;
  TORCH_ARG(int64_t, min_freq) = 2;
  TORCH_ARG(int64_t, max_tokens) = 20000;
  TORCH_ARG(int64_t, max_len) = 128;

 public:
  static const tk::OptionBinding<TextDataOptions>& binding() {
    static const auto b = tk::OptionBinding<TextDataOptions>()
        .bind(TRAINKIT_OPTION(min_records), tk::rule::integer(0), "fortunes: leave out files with fewer records")
        .bind(TRAINKIT_OPTION(test_fraction), tk::rule::number({"number in (0, 1)", 0.0, true, 1.0, true}),
              "fortunes: stratified test share, split with data.split_seed")
        .bind(TRAINKIT_OPTION(split_seed), tk::rule::integer(0),
              "Seed of the fortunes split, of the validation split and of the limit_train/limit_test subsets")
        .bind(TRAINKIT_OPTION(min_freq), tk::rule::integer(1), "Vocabulary: tokens seen fewer times become <unk>")
        .bind(TRAINKIT_OPTION(max_tokens), tk::rule::integer(2),
              "Vocabulary: at most this many entries, <unk> and <pad> included")
        .bind(TRAINKIT_OPTION(max_len), tk::rule::integer(0), "Keep the first max_len tokens of each text (0 = all)");
    return b;
  }
};

/// What the app reports beside the models: the data and the majority class.
struct TextStats {
  int64_t classes = 0;
  int64_t train_texts = 0;
  int64_t val_texts = 0;
  int64_t test_texts = 0;
  int64_t vocab = 0;
  std::string majority_class;
  double majority_accuracy = 0;
};

/// A stratified subset of about `limit` texts of `set` (all of it when limit is 0 or not smaller).
tk::data::TextSet subset(const tk::data::TextSet& set, int64_t limit, uint64_t seed) {
  if (limit <= 0 || limit >= set.size()) {
    return set;
  }
  const double drop = 1.0 - static_cast<double>(limit) / static_cast<double>(set.size());
  return tk::data::stratified_split(set, drop, seed).train;
}

struct Encoded {
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> labels;
  int64_t tokens = 0;
  int64_t unknown = 0;
};

Encoded encode(const std::vector<std::vector<std::string>>& tokenized, const std::vector<int64_t>& labels,
               const tk::data::Vocab& vocab) {
  Encoded e;
  e.labels = labels;
  for (const auto& tokens : tokenized) {
    e.ids.push_back(vocab.encode(tokens));
    e.tokens += static_cast<int64_t>(tokens.size());
    e.unknown += std::count(e.ids.back().begin(), e.ids.back().end(), vocab.unk_index());
  }
  return e;
}

std::vector<std::vector<std::string>> tokenize_all(const std::vector<std::string>& texts) {
  std::vector<std::vector<std::string>> out;
  out.reserve(texts.size());
  for (const auto& text : texts) {
    out.push_back(tk::data::basic_english_tokenize(text));
  }
  return out;
}

/// fortunes and imdb: texts on the host, padded batches moved to the run's device.
class TextData : public app::DataProvider {
 public:
  std::vector<std::string> datasets() const override { return {"fortunes", "imdb"}; }
  std::vector<app::ConfigKeys> keys() const override {
    return {app::ConfigKeys::of("data", TextDataOptions::binding(), "data.dataset = \"fortunes\" or \"imdb\"")};
  }
  /// The statistics of the last load.
  const TextStats& stats() const { return *stats_; }

  app::RunData load(const app::DataRequest& request) const override {
    const app::Config& c = request.config;
    const auto o = app::read_extra(c, "data", TextDataOptions::binding());
    if (request.world_size > 1) {
      throw app::ConfigError(fmt::format("{}: data.dataset = \"{}\" trains in one process (its loader has no "
                                         "shards); run it without the launcher",
                                         request.source, c.data.dataset));
    }
    // The image sets' own keys must keep their defaults: nothing here would honour them.
    const auto& image_keys = app::ImageDataOptions::binding();
    const tk::ArgTable set = tk::options_table(image_keys, app::read_extra(c, "data", image_keys));
    const tk::ArgTable defaults = tk::options_table(image_keys, app::ImageDataOptions());
    for (size_t i = 0; i < set.size(); ++i) {
      if (set[i].second.to_string() != defaults[i].second.to_string()) {
        throw app::ConfigError(fmt::format("{}: data.{} applies to the image sets, not to data.dataset = \"{}\"",
                                           request.source, set[i].first, c.data.dataset));
      }
    }
    const auto seed = static_cast<uint64_t>(o.split_seed());
    tk::data::TextSplit split;
    if (c.data.dataset == "fortunes") {
      const auto all = tk::data::read_fortunes(c.data.dir, tk::data::FortunesOptions().min_records(o.min_records()));
      split = tk::data::stratified_split(all, o.test_fraction(), seed);
      spdlog::info("data: {} fortune files with >= {} records, stratified {:.0f}/{:.0f} split (seed {})",
                   all.classes.size(), o.min_records(), 100 * (1 - o.test_fraction()), 100 * o.test_fraction(),
                   o.split_seed());
    } else {
      split = tk::data::read_aclimdb(c.data.dir);
      spdlog::info("data: aclImdb train/ and test/ folders in {}", c.data.dir);
    }
    split.train = subset(split.train, c.data.limit_train, seed);
    split.test = subset(split.test, c.data.limit_test, seed + 1);
    tk::data::TextSet val;
    if (c.data.val_size > 0) {
      if (c.data.val_size >= split.train.size()) {
        throw app::ConfigError(fmt::format("{}: data.val_size ({}) must be smaller than the {} training texts",
                                           request.source, c.data.val_size, split.train.size()));
      }
      auto parts = tk::data::stratified_split(
          split.train, static_cast<double>(c.data.val_size) / static_cast<double>(split.train.size()), seed + 2);
      split.train = std::move(parts.train);
      val = std::move(parts.test);
    }
    const auto train_tokens = tokenize_all(split.train.texts);
    const tk::data::Vocab vocab(train_tokens,
                                tk::data::VocabOptions().min_freq(o.min_freq()).max_tokens(o.max_tokens()));
    const Encoded train_ids = encode(train_tokens, split.train.labels, vocab);
    const Encoded val_ids = encode(tokenize_all(val.texts), val.labels, vocab);
    const Encoded test_ids = encode(tokenize_all(split.test.texts), split.test.labels, vocab);

    TextStats& s = *stats_;
    s.classes = static_cast<int64_t>(split.train.classes.size());
    s.train_texts = split.train.size();
    s.val_texts = val.size();
    s.test_texts = split.test.size();
    s.vocab = vocab.size();
    const auto counts = split.train.class_counts();
    const auto majority = std::max_element(counts.begin(), counts.end()) - counts.begin();
    s.majority_class = split.train.classes[static_cast<size_t>(majority)];
    s.majority_accuracy =
        static_cast<double>(std::count(split.test.labels.begin(), split.test.labels.end(), majority)) /
        static_cast<double>(std::max<int64_t>(split.test.size(), 1));
    spdlog::info("data: {} classes, {} training / {} validation / {} test texts; mean length {:.1f} tokens "
                 "(max_len {})",
                 s.classes, s.train_texts, s.val_texts, s.test_texts,
                 static_cast<double>(train_ids.tokens) / static_cast<double>(std::max<int64_t>(s.train_texts, 1)),
                 o.max_len());
    spdlog::info("vocab: {} entries (min_freq {}, max_tokens {}); <unk> is {:.1f}% of test tokens", s.vocab,
                 o.min_freq(), o.max_tokens(),
                 100.0 * static_cast<double>(test_ids.unknown) / static_cast<double>(std::max<int64_t>(test_ids.tokens, 1)));
    spdlog::info("majority class \"{}\" ({} training texts): test accuracy {:.4f}", s.majority_class,
                 counts[static_cast<size_t>(majority)], s.majority_accuracy);

    const auto loader = [&](const Encoded& e, bool train) -> std::unique_ptr<tk::data::BatchSource> {
      auto options = tk::data::SequenceLoaderOptions()
                         .batch_size(train ? c.train.batch_size : c.train.eval_batch_size)
                         .shuffle(train)
                         .seed(static_cast<uint64_t>(c.train.seed))
                         .pad_index(vocab.pad_index())
                         .max_len(o.max_len());
      return std::make_unique<tk::data::DeviceSource>(
          std::make_shared<tk::data::SequenceLoader>(e.ids, e.labels, options), request.device);
    };
    app::RunData run;
    run.train = loader(train_ids, true);
    if (s.val_texts > 0) {
      run.val = loader(val_ids, false);
    }
    run.test = loader(test_ids, false);
    run.train_examples = s.train_texts;
    run.val_examples = s.val_texts;
    run.test_examples = s.test_texts;
    run.info.classes = s.classes;
    run.info.vocab_size = vocab.size();
    run.info.pad_index = vocab.pad_index();
    return run;
  }

 private:
  std::shared_ptr<TextStats> stats_ = std::make_shared<TextStats>();
};

// ---- the model provider ---------------------------------------------------------------------------------

/// The text models' own `[model]` keys (model.hidden is the LSTM's hidden size, model.dropout its dropout: the
/// image models' keys, app::ImageModelOptions).
struct TextModelOptions {
  TORCH_ARG(int64_t, embedding_dim) = 64;
  TORCH_ARG(int64_t, num_layers) = 1;
  TORCH_ARG(bool, bidirectional) = true;

 public:
  static const tk::OptionBinding<TextModelOptions>& binding() {
    static const auto b = tk::OptionBinding<TextModelOptions>()
        .bind(TRAINKIT_OPTION(embedding_dim), tk::rule::integer(1), "lstm: width of the token embedding")
        .bind(TRAINKIT_OPTION(num_layers), tk::rule::integer(1), "lstm: stacked LSTM layers")
        .bind(TRAINKIT_OPTION(bidirectional), tk::rule::boolean(),
              "lstm: a second direction, the final states concatenated");
    return b;
  }
};

/// lstm (embedding + packed LSTM + linear) and bow (bag-of-words logistic regression) over token ids.
class TextModels : public app::ModelProvider {
 public:
  std::vector<std::string> models() const override { return {"lstm", "bow"}; }
  std::vector<app::ConfigKeys> keys() const override {
    return {app::ConfigKeys::of("model", TextModelOptions::binding(), "model.name = \"lstm\"")};
  }

  app::ModelParts build(const app::Config& config, const app::DataInfo& data,
                        const std::string& source) const override {
    const auto& m = config.model;
    if (data.vocab_size == 0) {
      throw app::ConfigError(fmt::format("{}: model.name = \"{}\" reads token ids, but data.dataset = \"{}\" gives "
                                         "none",
                                         source, m.name, config.data.dataset));
    }
    if (m.checkpoint_segments > 0) {
      throw app::ConfigError(fmt::format("{}: model.checkpoint_segments applies to the image models, not to "
                                         "model.name = \"{}\"",
                                         source, m.name));
    }
    const auto image = app::read_extra(config, "model", app::ImageModelOptions::binding());
    if (image.channels_last()) {
      throw app::ConfigError(fmt::format("{}: model.channels_last applies to the image models, not to "
                                         "model.name = \"{}\"",
                                         source, m.name));
    }
    if (m.name == "bow") {
      tk::nn::BagOfWordsClassifier bow(
          tk::nn::BagOfWordsClassifierOptions(data.vocab_size, data.classes).padding_idx(data.pad_index));
      return {bow.ptr(), [bow](const tk::data::Batch& b) mutable { return bow->forward(b.input("tokens"), b.input("lengths")); },
              nullptr};
    }
    const auto o = app::read_extra(config, "model", TextModelOptions::binding());
    const auto shared = image.cnn();
    const auto options = tk::nn::LstmClassifierOptions(data.vocab_size, data.classes)
                             .embedding_dim(o.embedding_dim())
                             .hidden_size(shared.hidden())
                             .num_layers(o.num_layers())
                             .bidirectional(o.bidirectional())
                             .dropout(shared.dropout())
                             .padding_idx(data.pad_index);
    try {
      tk::nn::LstmClassifierImpl::validate(options);
    } catch (const std::invalid_argument& e) {
      throw app::ConfigError(fmt::format("{}: [model]: {}", source, e.what()));
    }
    tk::nn::LstmClassifier lstm(options);
    return {lstm.ptr(),
            [lstm](const tk::data::Batch& b) mutable { return lstm->forward(b.input("tokens"), b.input("lengths")); },
            nullptr};
  }
};

// ---- the app ----------------------------------------------------------------------------------------------

/// `[baseline]`: the bag-of-words model, trained by the same job after the LSTM.
struct BaselineOptions {
  TORCH_ARG(bool, enabled) = true;
  TORCH_ARG(int64_t, epochs) = 0;
  TORCH_ARG(std::optional<double>, max_lr) = std::nullopt;

 public:
  static const tk::OptionBinding<BaselineOptions>& binding() {
    static const auto b = tk::OptionBinding<BaselineOptions>()
        .bind(TRAINKIT_OPTION(enabled), tk::rule::boolean(),
              "Also train the bag-of-words logistic regression (model.name = \"bow\") into <out>/baseline")
        .bind(TRAINKIT_OPTION(epochs), tk::rule::integer(0), "The baseline's epochs (0 = train.epochs)")
        .bind(TRAINKIT_OPTION(max_lr), tk::rule::number(tk::positive()),
              "Replaces scheduler.max_lr for the baseline (unset = the same)");
    return b;
  }
};

struct Options {
  std::string config = std::string(TRAINKIT_SOURCE_DIR) + "/configs/text_classification.toml";
  std::vector<std::string> sets;
  std::string dataset;
  std::string data_dir;
  int64_t epochs = 0;
  int64_t limit_train = -1;
  std::string out;
};

std::string json_number(const std::optional<double>& x) {
  return x ? fmt::format("{:.6f}", *x) : std::string("null");
}

int run(const Options& o) {
  auto text = std::make_shared<TextData>();
  const app::Catalog catalog = app::Catalog::builtin()
                                   .add(text)
                                   .add(std::make_shared<TextModels>())
                                   .add(app::ConfigKeys::of("baseline", BaselineOptions::binding()));
  std::vector<std::string> overrides = o.sets;
  if (!o.dataset.empty()) {
    overrides.push_back(fmt::format("data.dataset=\"{}\"", o.dataset));
  }
  if (!o.data_dir.empty()) {
    overrides.push_back("data.dir=" + o.data_dir);
  }
  if (o.epochs > 0) {
    overrides.push_back(fmt::format("train.epochs={}", o.epochs));
  }
  if (o.limit_train >= 0) {
    overrides.push_back(fmt::format("data.limit_train={}", o.limit_train));
  }
  // Both configs are read (and checked) before anything is loaded or trained.
  const app::Config config = app::load_config(o.config, overrides, catalog.extensions());
  const auto baseline = app::read_extra(config, "baseline", BaselineOptions::binding());
  std::vector<std::string> bow_overrides = overrides;
  bow_overrides.emplace_back("model.name=\"bow\"");
  bow_overrides.push_back(fmt::format("train.epochs={}", baseline.epochs() > 0 ? baseline.epochs() : config.trainer.epochs()));
  if (baseline.max_lr()) {
    bow_overrides.push_back(fmt::format("scheduler.max_lr={}", *baseline.max_lr()));
  }
  if (baseline.enabled()) {
    app::load_config(o.config, bow_overrides, catalog.extensions());
  }

  const app::TrainJobResult lstm = app::run_train_job({o.config, overrides, o.out, "", catalog});
  const TextStats stats = text->stats();
  std::optional<app::TrainJobResult> bow;
  if (baseline.enabled()) {
    bow = app::run_train_job({o.config, bow_overrides, lstm.run_dir + "/baseline", "", catalog});
  }
  fmt::print("\n{:<36} {:>13} {:>10}\n", "test accuracy", "", "job time");
  fmt::print("{:<36} {:>13.4f} {:>9.1f}s\n", "LSTM classifier", lstm.test_metrics.at("accuracy"),
             lstm.wall_seconds);
  if (bow) {
    fmt::print("{:<36} {:>13.4f} {:>9.1f}s\n", "bag-of-words logistic regression", bow->test_metrics.at("accuracy"),
               bow->wall_seconds);
  }
  fmt::print("{:<36} {:>13.4f}\n", fmt::format("majority class (\"{}\")", stats.majority_class),
             stats.majority_accuracy);
  std::ofstream json(lstm.run_dir + "/comparison.json");
  json << fmt::format(
      "{{\"dataset\": \"{}\", \"classes\": {}, \"train_texts\": {}, \"val_texts\": {}, \"test_texts\": {}, "
      "\"vocab\": {}, \"lstm_test_accuracy\": {:.6f}, \"bow_test_accuracy\": {}, \"majority_test_accuracy\": {:.6f}}}\n",
      config.data.dataset, stats.classes, stats.train_texts, stats.val_texts, stats.test_texts, stats.vocab,
      lstm.test_metrics.at("accuracy"),
      json_number(bow ? std::optional<double>(bow->test_metrics.at("accuracy")) : std::nullopt),
      stats.majority_accuracy);
  fmt::print("wrote {0}/ (the LSTM's run), {0}/baseline/ and {0}/comparison.json\n", lstm.run_dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "Text classification: an LSTM (pack_padded_sequence) with OneCycleLR and gradient clipping on "
      "Debian's fortunes (one class per file) or the aclImdb reviews, against the majority class and a "
      "bag-of-words logistic regression, both trained by trainkit train's job with this app's data and model "
      "providers"};
  Options o;
  cli.option("--config", o.config,
             "TOML config: trainkit train's sections, the text data's and models' keys, and [baseline]")
      .show_default();
  cli.option("--set", o.sets, "Override a config key: section.key=value (repeatable)");
  cli.option("--dataset", o.dataset, "fortunes or imdb (= --set data.dataset=...)").one_of({"fortunes", "imdb"});
  cli.option("--data-dir", o.data_dir, "The fortunes directory or the extracted aclImdb directory (= data.dir)");
  cli.option("--epochs", o.epochs, "Epochs of the LSTM (= train.epochs)").range(1, 100000);
  cli.option("--limit-train", o.limit_train, "Train on a stratified subset of this many texts (= data.limit_train)")
      .non_negative();
  cli.option("--out", o.out,
             "Run directory of the LSTM (the baseline's is <out>/baseline); default runs/<config name>-<time>");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  tk::app::set_log_level("info");
  return tk::app::run_main([&] { return run(o); });
}
