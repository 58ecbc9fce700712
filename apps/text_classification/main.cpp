// text_classification: the LR notes' text case study. Texts are tokenized with torchtext's basic_english
// rules, encoded with a vocabulary built on the training split, padded per batch with their lengths and
// classified by embedding + LSTM (run on pack_padded_sequence) + linear, trained by the Trainer with
// OneCycleLR and gradient clipping. The test accuracy is reported against the majority class and against a
// bag-of-words logistic regression trained by the same Trainer, optimizer and schedule on the same vocabulary.
//
// Data: Debian's fortunes package (one class per fortune file, a seeded stratified split; the default), or
// the aclImdb layout of the IMDB reviews (`--dataset imdb --data-dir aclImdb`, or `--set data.dir=...`).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <initializer_list>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/main.h"
#include "trainkit/app/toml_args.h"
#include "trainkit/args.h"
#include "trainkit/data.h"
#include "trainkit/log.h"
#include "trainkit/nn.h"
#include "trainkit/optim.h"
#include "trainkit/sched.h"
#include "trainkit/train.h"

namespace {

namespace tk = trainkit;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---- configuration: one default per key, here; the TOML file and --set override them --------------------

struct DataConfig {
  std::string dataset = "fortunes";
  std::string dir = "/usr/share/games/fortunes";
  int64_t min_records = 50;
  double test_fraction = 0.2;
  int64_t seed = 0;
  int64_t limit_train = 0;
  int64_t limit_test = 0;
  int64_t min_freq = 2;
  int64_t max_tokens = 20000;
  int64_t max_len = 128;
};

struct ModelConfig {
  int64_t embedding_dim = 64;
  int64_t hidden_size = 64;
  int64_t num_layers = 1;
  bool bidirectional = true;
  double dropout = 0.3;
};

struct TrainConfig {
  int64_t epochs = 6;
  int64_t batch_size = 64;
  int64_t seed = 0;
  double clip_grad_norm = 1.0;
  int64_t threads = 1;
};

struct BaselineConfig {
  bool enabled = true;
  int64_t epochs = 0;             // 0 = train.epochs
  std::optional<double> max_lr;   // replaces scheduler.max_lr for the baseline
};

struct Config {
  DataConfig data;
  ModelConfig model;
  TrainConfig train;
  BaselineConfig baseline;
  tk::optim::OptimizerSpec optimizer;
  tk::ArgTable scheduler_table;  // kept to rebuild the baseline's schedule with its own max_lr
  tk::sched::SchedulerSpec scheduler;
  std::string source;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw tk::ArgError(fmt::format("{}: cannot open the config file", path));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The table `section` of `root`, created when absent. Throws for a key that is not a table.
tk::ArgTable& section_table(tk::ArgTable& root, const std::string& section, const std::string& where) {
  tk::ArgValue* value = tk::find_arg(root, section);
  if (value == nullptr) {
    tk::set_arg(root, section, tk::ArgValue(tk::ArgTable{}));
    value = tk::find_arg(root, section);
  }
  auto* table = value->get_if<tk::ArgTable>();
  if (table == nullptr) {
    throw tk::ArgError(fmt::format("{}: '{}' is not a table", where, section), section);
  }
  return *table;
}

/// Applies `section.key=value` (TOML value syntax, bare words are strings).
void apply_set(tk::ArgTable& root, const std::string& text) {
  const std::string where = "--set " + text;
  const auto eq = text.find('=');
  const auto dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    throw tk::ArgError(fmt::format("{}: expected section.key=value", where));
  }
  const std::string section = text.substr(0, dot);
  tk::set_arg(section_table(root, section, where), text.substr(dot + 1, eq - dot - 1),
              tk::app::parse_toml_value(text.substr(eq + 1)));
}

template <class T>
void read_into(std::optional<T> value, T& field) {
  if (value) {
    field = *value;
  }
}

Config read_config(tk::ArgTable root, const std::string& source) {
  Config c;
  c.source = source;
  for (const auto& [section, value] : root) {
    static const std::vector<std::string> known = {"data", "model", "optimizer", "scheduler", "train", "baseline"};
    if (std::find(known.begin(), known.end(), section) == known.end()) {
      throw tk::ArgError(fmt::format("{}: unknown section [{}] (known: data, model, optimizer, scheduler, train, "
                                     "baseline)",
                                     source, section),
                         section);
    }
    if (value.get_if<tk::ArgTable>() == nullptr) {
      throw tk::ArgError(fmt::format("{}: '{}' must be a table", source, section), section);
    }
  }
  const auto table = [&](const std::string& name) -> tk::ArgTable& { return section_table(root, name, source); };
  {
    tk::ArgReader a(table("data"), source + ": [data]");
    auto& d = c.data;
    read_into(a.string("dataset"), d.dataset);
    read_into(a.string("dir"), d.dir);
    read_into(a.integer("min_records"), d.min_records);
    read_into(a.number("test_fraction"), d.test_fraction);
    read_into(a.integer("seed"), d.seed);
    read_into(a.integer("limit_train"), d.limit_train);
    read_into(a.integer("limit_test"), d.limit_test);
    read_into(a.integer("min_freq"), d.min_freq);
    read_into(a.integer("max_tokens"), d.max_tokens);
    read_into(a.integer("max_len"), d.max_len);
    a.finish("[data]");
    if (d.dataset != "fortunes" && d.dataset != "imdb") {
      a.fail("dataset", "\"fortunes\" or \"imdb\"");
    }
    if (!(d.test_fraction > 0 && d.test_fraction < 1)) {
      a.fail("test_fraction", "a number in (0, 1)");
    }
    for (const auto& [key, v] : std::initializer_list<std::pair<const char*, int64_t>>{
             {"min_records", d.min_records},
                                 {"limit_train", d.limit_train}, {"limit_test", d.limit_test},
                                 {"max_len", d.max_len}, {"max_tokens", d.max_tokens}, {"seed", d.seed}}) {
      if (v < 0) {
        a.fail(key, "an integer >= 0");
      }
    }
    if (d.min_freq < 1) {
      a.fail("min_freq", "an integer >= 1");
    }
  }
  {
    tk::ArgReader a(table("model"), source + ": [model]");
    auto& m = c.model;
    read_into(a.integer("embedding_dim"), m.embedding_dim);
    read_into(a.integer("hidden_size"), m.hidden_size);
    read_into(a.integer("num_layers"), m.num_layers);
    read_into(a.boolean("bidirectional"), m.bidirectional);
    read_into(a.number("dropout"), m.dropout);
    a.finish("[model]");
    tk::nn::LstmClassifierImpl::validate(tk::nn::LstmClassifierOptions(3, 2)
                                             .embedding_dim(m.embedding_dim)
                                             .hidden_size(m.hidden_size)
                                             .num_layers(m.num_layers)
                                             .dropout(m.dropout)
                                             .padding_idx(1));
  }
  {
    tk::ArgReader a(table("train"), source + ": [train]");
    auto& t = c.train;
    read_into(a.integer("epochs"), t.epochs);
    read_into(a.integer("batch_size"), t.batch_size);
    read_into(a.integer("seed"), t.seed);
    read_into(a.number("clip_grad_norm"), t.clip_grad_norm);
    read_into(a.integer("threads"), t.threads);
    a.finish("[train]");
    if (t.epochs < 1) {
      a.fail("epochs", "an integer >= 1");
    }
    if (t.batch_size < 1) {
      a.fail("batch_size", "an integer >= 1");
    }
    if (t.seed < 0) {
      a.fail("seed", "an integer >= 0");
    }
    if (t.clip_grad_norm < 0) {
      a.fail("clip_grad_norm", "a number >= 0 (0 = off)");
    }
    if (t.threads < 1) {
      a.fail("threads", "an integer >= 1");
    }
  }
  {
    tk::ArgReader a(table("baseline"), source + ": [baseline]");
    auto& b = c.baseline;
    read_into(a.boolean("enabled"), b.enabled);
    read_into(a.integer("epochs"), b.epochs);
    b.max_lr = a.number("max_lr");
    a.finish("[baseline]");
    if (b.epochs < 0) {
      a.fail("epochs", "an integer >= 0 (0 = train.epochs)");
    }
    if (b.max_lr && *b.max_lr <= 0) {
      a.fail("max_lr", "a number > 0");
    }
  }
  {
    tk::ArgReader a(table("optimizer"), source + ": [optimizer]");
    const std::string name = a.has("name") ? *a.string("name") : "adamw";
    c.optimizer = tk::optim::parse_optimizer(name, a, "optimizer");
  }
  c.scheduler_table = table("scheduler");
  if (c.scheduler_table.empty()) {
    c.scheduler_table = {{"type", tk::ArgValue("OneCycleLR")}, {"max_lr", tk::ArgValue(0.004)}};
  }
  c.scheduler = tk::sched::parse_scheduler(c.scheduler_table, source + ": [scheduler]");
  if (c.baseline.max_lr) {
    // Checked now, so that a schedule without max_lr fails before anything trains.
    auto baseline_table = c.scheduler_table;
    tk::set_arg(baseline_table, "max_lr", tk::ArgValue(*c.baseline.max_lr));
    tk::sched::parse_scheduler(baseline_table, source + ": [scheduler] with baseline.max_lr");
  }
  return c;
}

// ---- data ---------------------------------------------------------------------------------------------------

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

// ---- training -----------------------------------------------------------------------------------------------

/// Prints one row per epoch and writes it to metrics.csv when an output directory is given.
class EpochTable : public tk::train::Callback {
 public:
  explicit EpochTable(std::shared_ptr<tk::log::MetricsWriter> metrics) : metrics_(std::move(metrics)) {}
  void on_train_begin(tk::train::Trainer&) override {
    start_ = Clock::now();
    fmt::print("{:>6} {:>10} {:>11} {:>10} {:>10} {:>9}\n", "epoch", "lr", "train loss", "test loss", "test acc",
               "seconds");
  }
  bool on_epoch_end(tk::train::Trainer& trainer, const tk::train::EpochEvent& e) override {
    const double lr = trainer.optimizer().param_groups().front().options().get_lr();
    const auto& test = e.val.value();
    fmt::print("{:>6} {:>10.2e} {:>11.4f} {:>10.4f} {:>10.4f} {:>9.1f}\n", e.epoch + 1, lr, e.train_loss, test.loss,
               test.metric("accuracy"), seconds_since(start_));
    std::fflush(stdout);
    if (metrics_) {
      tk::log::MetricRow row;
      row.kind = "epoch";
      row.step = e.step;
      row.epoch = e.epoch;
      row.loss = e.train_loss;
      row.lr = lr;
      row.val_loss = test.loss;
      row.val_metrics = {{"accuracy", test.metric("accuracy")}};
      metrics_->write(row);
    }
    return false;
  }

 private:
  std::shared_ptr<tk::log::MetricsWriter> metrics_;
  Clock::time_point start_;
};

struct FitResult {
  double accuracy = 0;
  double loss = 0;
  double seconds = 0;
};

/// Trains `module` (through `forward`) with the config's optimizer, the given schedule and clipping by the
/// Trainer, evaluating on `test` after every epoch; returns the last epoch's test result.
FitResult fit(std::shared_ptr<torch::nn::Module> module, const tk::train::ForwardFn& forward, const Config& c,
              const tk::sched::SchedulerSpec& schedule, int64_t epochs, tk::data::SequenceLoader& train,
              tk::data::SequenceLoader& test, std::shared_ptr<tk::log::MetricsWriter> metrics) {
  auto optimizer = tk::optim::make_optimizer(c.optimizer, module->parameters());
  tk::train::Trainer trainer(module, forward, *optimizer,
                             tk::train::TrainerOptions().epochs(epochs).clip_grad_norm(c.train.clip_grad_norm));
  const auto built = tk::sched::make_scheduler(schedule, *optimizer,
                                               tk::sched::SchedulerContext{epochs, train.num_batches()});
  trainer.set_scheduler(built.scheduler, /*per_step=*/built.interval == "step");
  trainer.add_callback(std::make_shared<EpochTable>(std::move(metrics)));
  const auto start = Clock::now();
  trainer.fit(train, &test);
  FitResult r;
  r.seconds = seconds_since(start);
  const auto final_result = trainer.evaluate(test);
  r.accuracy = final_result.metric("accuracy");
  r.loss = final_result.loss;
  return r;
}

struct Options {
  std::string config = std::string(TRAINKIT_SOURCE_DIR) + "/configs/text_classification.toml";
  std::vector<std::string> sets;
  std::string dataset;
  std::string data_dir;
  int64_t epochs = 0;
  int64_t limit_train = -1;
  std::string out;
};

int run(const Options& o) {
  const auto start = Clock::now();
  tk::ArgTable root = tk::app::parse_toml(read_text(o.config), o.config);
  for (const auto& s : o.sets) {
    apply_set(root, s);
  }
  if (!o.dataset.empty()) {
    apply_set(root, "data.dataset=\"" + o.dataset + "\"");
  }
  if (!o.data_dir.empty()) {
    tk::set_arg(section_table(root, "data", "--data-dir"), "dir", tk::ArgValue(o.data_dir));
  }
  if (o.epochs > 0) {
    tk::set_arg(section_table(root, "train", "--epochs"), "epochs", tk::ArgValue(o.epochs));
  }
  if (o.limit_train >= 0) {
    tk::set_arg(section_table(root, "data", "--limit-train"), "limit_train", tk::ArgValue(o.limit_train));
  }
  const Config c = read_config(root, o.config);
  torch::set_num_threads(static_cast<int>(c.train.threads));
  torch::manual_seed(static_cast<uint64_t>(c.train.seed));

  // Data: texts and labels, split, tokenized, encoded with the training split's vocabulary.
  tk::data::TextSplit split;
  std::string split_note;
  if (c.data.dataset == "fortunes") {
    const auto all = tk::data::read_fortunes(c.data.dir, tk::data::FortunesOptions().min_records(c.data.min_records));
    split = tk::data::stratified_split(all, c.data.test_fraction, static_cast<uint64_t>(c.data.seed));
    split_note = fmt::format("{} fortune files with >= {} records, stratified {:.0f}/{:.0f} split (seed {})",
                             all.classes.size(), c.data.min_records, 100 * (1 - c.data.test_fraction),
                             100 * c.data.test_fraction, c.data.seed);
  } else {
    split = tk::data::read_aclimdb(c.data.dir);
    split_note = "aclImdb train/ and test/ folders";
  }
  split.train = subset(split.train, c.data.limit_train, static_cast<uint64_t>(c.data.seed));
  split.test = subset(split.test, c.data.limit_test, static_cast<uint64_t>(c.data.seed) + 1);
  const auto train_tokens = tokenize_all(split.train.texts);
  const auto test_tokens = tokenize_all(split.test.texts);
  const tk::data::Vocab vocab(train_tokens,
                              tk::data::VocabOptions().min_freq(c.data.min_freq).max_tokens(c.data.max_tokens));
  const Encoded train_ids = encode(train_tokens, split.train.labels, vocab);
  const Encoded test_ids = encode(test_tokens, split.test.labels, vocab);
  const auto num_classes = static_cast<int64_t>(split.train.classes.size());

  const auto counts = split.train.class_counts();
  const auto majority = std::max_element(counts.begin(), counts.end()) - counts.begin();
  const double majority_accuracy =
      static_cast<double>(std::count(split.test.labels.begin(), split.test.labels.end(), majority)) /
      static_cast<double>(split.test.size());
  fmt::print("data     {} ({}): {}\n", c.data.dataset, c.data.dir, split_note);
  fmt::print("         {} classes, {} training / {} test texts; mean length {:.1f} tokens (max_len {})\n",
             num_classes, split.train.size(), split.test.size(),
             static_cast<double>(train_ids.tokens) / static_cast<double>(split.train.size()), c.data.max_len);
  fmt::print("vocab    {} entries (min_freq {}, max_tokens {}); <unk> is {:.1f}% of test tokens\n", vocab.size(),
             c.data.min_freq, c.data.max_tokens,
             100.0 * static_cast<double>(test_ids.unknown) / static_cast<double>(std::max<int64_t>(test_ids.tokens, 1)));
  fmt::print("majority class \"{}\" ({} training texts): test accuracy {:.4f}\n",
             split.train.classes[static_cast<size_t>(majority)], counts[static_cast<size_t>(majority)],
             majority_accuracy);

  const auto loaders = [&](uint64_t seed) {
    auto train = std::make_unique<tk::data::SequenceLoader>(
        train_ids.ids, train_ids.labels,
        tk::data::SequenceLoaderOptions().batch_size(c.train.batch_size).seed(seed).pad_index(vocab.pad_index())
            .max_len(c.data.max_len));
    auto test = std::make_unique<tk::data::SequenceLoader>(
        test_ids.ids, test_ids.labels,
        tk::data::SequenceLoaderOptions().batch_size(256).shuffle(false).pad_index(vocab.pad_index())
            .max_len(c.data.max_len));
    return std::make_pair(std::move(train), std::move(test));
  };

  std::shared_ptr<tk::log::MetricsWriter> lstm_metrics, bow_metrics;
  if (!o.out.empty()) {
    std::filesystem::create_directories(o.out + "/baseline");
    lstm_metrics = std::make_shared<tk::log::MetricsWriter>(o.out, false);
    bow_metrics = std::make_shared<tk::log::MetricsWriter>(o.out + "/baseline", false);
  }

  // The LSTM classifier.
  const auto& m = c.model;
  tk::nn::LstmClassifier lstm(tk::nn::LstmClassifierOptions(vocab.size(), num_classes)
                                  .embedding_dim(m.embedding_dim)
                                  .hidden_size(m.hidden_size)
                                  .num_layers(m.num_layers)
                                  .bidirectional(m.bidirectional)
                                  .dropout(m.dropout)
                                  .padding_idx(vocab.pad_index()));
  fmt::print("\nmodel    LSTM classifier ({}, {} layer{}, hidden {}, embedding {}, dropout {})\n",
             m.bidirectional ? "bidirectional" : "unidirectional", m.num_layers, m.num_layers > 1 ? "s" : "",
             m.hidden_size, m.embedding_dim, m.dropout);
  fmt::print("{}\n", tk::train::summary(*lstm).to_string());
  const int64_t steps_per_epoch = (split.train.size() + c.train.batch_size - 1) / c.train.batch_size;
  fmt::print("train    {} epochs x {} steps, batch {}, optimizer {}, {} stepped per {}, clip_grad_norm {}\n",
             c.train.epochs, steps_per_epoch, c.train.batch_size, c.optimizer.name, c.scheduler.type, c.scheduler.interval, c.train.clip_grad_norm);
  tk::train::ForwardFn lstm_forward = [lstm](const tk::data::Batch& b) mutable {
    return lstm->forward(b.input("tokens"), b.input("lengths"));
  };
  auto [lstm_train, lstm_test] = loaders(static_cast<uint64_t>(c.train.seed));
  const FitResult lstm_result =
      fit(lstm.ptr(), lstm_forward, c, c.scheduler, c.train.epochs, *lstm_train, *lstm_test, lstm_metrics);

  // The bag-of-words logistic regression on the same vocabulary, by the same code.
  std::optional<FitResult> bow_result;
  int64_t bow_epochs = c.baseline.epochs > 0 ? c.baseline.epochs : c.train.epochs;
  if (c.baseline.enabled) {
    auto schedule = c.scheduler;
    if (c.baseline.max_lr) {
      auto table = c.scheduler_table;
      tk::set_arg(table, "max_lr", tk::ArgValue(*c.baseline.max_lr));
      schedule = tk::sched::parse_scheduler(table, c.source + ": [scheduler] with baseline.max_lr");
    }
    torch::manual_seed(static_cast<uint64_t>(c.train.seed));
    tk::nn::BagOfWordsClassifier bow(
        tk::nn::BagOfWordsClassifierOptions(vocab.size(), num_classes).padding_idx(vocab.pad_index()));
    fmt::print("\nbaseline bag-of-words logistic regression ({} parameters), {} epochs{}\n",
               tk::train::summary(*bow).params, bow_epochs,
               c.baseline.max_lr ? fmt::format(", max_lr {}", *c.baseline.max_lr) : std::string());
    tk::train::ForwardFn bow_forward = [bow](const tk::data::Batch& b) mutable {
      return bow->forward(b.input("tokens"), b.input("lengths"));
    };
    auto [bow_train, bow_test] = loaders(static_cast<uint64_t>(c.train.seed));
    bow_result = fit(bow.ptr(), bow_forward, c, schedule, bow_epochs, *bow_train, *bow_test, bow_metrics);
  }

  const double total = seconds_since(start);
  fmt::print("\n{:<36} {:>13} {:>10}\n", "test accuracy", "", "train time");
  fmt::print("{:<36} {:>13.4f} {:>9.1f}s\n", "LSTM classifier", lstm_result.accuracy, lstm_result.seconds);
  if (bow_result) {
    fmt::print("{:<36} {:>13.4f} {:>9.1f}s\n", "bag-of-words logistic regression", bow_result->accuracy,
               bow_result->seconds);
  }
  fmt::print("{:<36} {:>13.4f}\n", "majority class", majority_accuracy);
  fmt::print("wall time {:.1f} s (data, vocabulary, both trainings and evaluations)\n", total);
  if (!o.out.empty()) {
    lstm_metrics.reset();
    bow_metrics.reset();
    std::ofstream json(o.out + "/summary.json");
    json << fmt::format(
        "{{\"dataset\": \"{}\", \"classes\": {}, \"train_texts\": {}, \"test_texts\": {}, \"vocab\": {}, "
        "\"epochs\": {}, \"lstm_test_accuracy\": {:.6f}, \"lstm_train_seconds\": {:.2f}, "
        "\"bow_test_accuracy\": {}, \"bow_train_seconds\": {}, \"majority_test_accuracy\": {:.6f}, "
        "\"wall_seconds\": {:.2f}}}\n",
        c.data.dataset, num_classes, split.train.size(), split.test.size(), vocab.size(), c.train.epochs,
        lstm_result.accuracy, lstm_result.seconds,
        bow_result ? fmt::format("{:.6f}", bow_result->accuracy) : std::string("null"),
        bow_result ? fmt::format("{:.2f}", bow_result->seconds) : std::string("null"), majority_accuracy, total);
    fmt::print("wrote {0}/metrics.csv, {0}/baseline/metrics.csv, {0}/summary.json\n", o.out);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "Text classification: an LSTM (pack_padded_sequence) with OneCycleLR and gradient clipping on "
      "Debian's fortunes (one class per file) or the aclImdb reviews, against the majority class and a "
      "bag-of-words logistic regression trained by the same Trainer"};
  Options o;
  cli.option("--config", o.config, "TOML config ([data], [model], [optimizer], [scheduler], [train], [baseline])")
      .show_default();
  cli.option("--set", o.sets, "Override a config key: section.key=value (repeatable)");
  cli.option("--dataset", o.dataset, "fortunes or imdb (= --set data.dataset=...)").one_of({"fortunes", "imdb"});
  cli.option("--data-dir", o.data_dir, "The fortunes directory or the extracted aclImdb directory (= data.dir)");
  cli.option("--epochs", o.epochs, "Epochs of the LSTM (= train.epochs)").range(1, 100000);
  cli.option("--limit-train", o.limit_train, "Train on a stratified subset of this many texts (= data.limit_train)")
      .non_negative();
  cli.option("--out", o.out, "Directory for metrics.csv, baseline/metrics.csv and summary.json (optional)");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  tk::app::set_log_level("info");
  return tk::app::run_main([&] { return run(o); });
}
