// custom_data: your own data set and module in trainkit's training job. Your CSV file becomes your own
// torch::data Dataset (features standardized with the training split's statistics), whose torch::data
// loader reaches trainkit through data::from_torch_data inside a data provider; your own MLP comes from a
// model provider with the MSE loss. With both in the catalog, the LR finder's job suggests the peak LR and
// trainkit train's job trains with a 1cycle schedule and the MSE/MAE metrics ([configs/custom_data.toml]);
// the validation MSE is printed next to the data's noise variance, the error no model can beat. `--recipe`
// runs the short version in docs/training.md (the library without the app layer) instead.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "recipe.h"
#include "trainkit/app/cli.h"
#include "trainkit/app/jobs.h"
#include "trainkit/app/main.h"
#include "trainkit/app/providers.h"
#include "trainkit/data.h"
#include "trainkit/options.h"
#include "trainkit/train.h"
#include "trainkit/tune.h"

namespace {

namespace tk = trainkit;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// A numeric CSV file: one header line of column names, then one row of numbers per line. Lines that
/// start with '#' are comments; a comment holding "noise_sigma=S" states the target's noise level.
struct CsvTable {
  std::vector<std::string> columns;
  at::Tensor values;                  ///< [rows, columns], float32
  std::optional<double> noise_sigma;  ///< from a "noise_sigma=" comment, when the file has one
};

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) {
    return "";
  }
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> fields;
  size_t begin = 0;
  while (true) {
    const size_t comma = line.find(',', begin);
    fields.push_back(trim(line.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin)));
    if (comma == std::string::npos) {
      return fields;
    }
    begin = comma + 1;
  }
}

/// The whole field as a finite number, or std::nullopt.
std::optional<double> parse_number(const std::string& field) {
  if (field.empty()) {
    return std::nullopt;
  }
  char* end = nullptr;
  const double v = std::strtod(field.c_str(), &end);
  if (end != field.c_str() + field.size() || !std::isfinite(v)) {
    return std::nullopt;
  }
  return v;
}

/// Reads `path`; throws data::DataError naming the file (and the line) for a missing file, a row whose
/// field count differs from the header's, a field that is not a finite number, or a file without rows.
CsvTable read_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw tk::data::DataError(fmt::format("{}: cannot open the file (missing or unreadable)", path));
  }
  CsvTable table;
  std::vector<float> values;
  int64_t rows = 0;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    const std::string text = trim(line);
    if (text.empty()) {
      continue;
    }
    if (text[0] == '#') {
      const auto at = text.find("noise_sigma=");
      if (at != std::string::npos) {
        const std::string rest = text.substr(at + 12);
        table.noise_sigma = parse_number(rest.substr(0, rest.find_first_of(" ;,")));
      }
      continue;
    }
    auto fields = split_fields(text);
    if (table.columns.empty()) {
      if (fields.size() < 2) {
        throw tk::data::DataError(fmt::format("{}:{}: the header names {} column; need at least one feature "
                                              "and the target",
                                              path, line_no, fields.size()));
      }
      if (std::all_of(fields.begin(), fields.end(), [](const std::string& f) { return parse_number(f).has_value(); })) {
        throw tk::data::DataError(fmt::format("{}:{}: the first row is all numbers; the file needs a header line "
                                              "of column names first",
                                              path, line_no));
      }
      table.columns = std::move(fields);
      continue;
    }
    if (fields.size() != table.columns.size()) {
      throw tk::data::DataError(fmt::format("{}:{}: {} fields, but the header has {} columns", path, line_no,
                                            fields.size(), table.columns.size()));
    }
    for (size_t c = 0; c < fields.size(); ++c) {
      const auto v = parse_number(fields[c]);
      if (!v) {
        throw tk::data::DataError(fmt::format("{}:{}: column {} (\"{}\"): \"{}\" is not a finite number", path,
                                              line_no, c + 1, table.columns[c], fields[c]));
      }
      values.push_back(static_cast<float>(*v));
    }
    ++rows;
  }
  if (table.columns.empty()) {
    throw tk::data::DataError(fmt::format("{}: empty file (no header line, no rows)", path));
  }
  if (rows == 0) {
    throw tk::data::DataError(fmt::format("{}: a header but no data rows", path));
  }
  const auto cols = static_cast<int64_t>(table.columns.size());
  table.values = torch::from_blob(values.data(), {rows, cols}, torch::kFloat32).clone();
  return table;
}

/// Per-feature mean and standard deviation of the training rows; applied to every split so that the
/// validation rows never leak into the scaling.
struct Standardizer {
  at::Tensor mean;
  at::Tensor stddev;
  explicit Standardizer(const at::Tensor& train_features)
      : mean(train_features.mean(0)), stddev(train_features.std(0).clamp_min(1e-8)) {}
  at::Tensor operator()(const at::Tensor& features) const { return (features - mean) / stddev; }
};

/// The user's own dataset: standardized feature rows and their targets, one Example per row.
class RegressionRows : public torch::data::datasets::Dataset<RegressionRows> {
 public:
  RegressionRows(const at::Tensor& features, at::Tensor targets, const Standardizer& scale)
      : features_(scale(features)), targets_(std::move(targets)) {}
  torch::data::Example<> get(size_t index) override {
    return {features_[static_cast<int64_t>(index)], targets_[static_cast<int64_t>(index)]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(features_.size(0)); }

 private:
  at::Tensor features_;  // [N, F]
  at::Tensor targets_;   // [N, 1]
};

/// The user's own module: an MLP with two hidden ReLU layers and one output.
struct RegressorImpl : torch::nn::Module {
  RegressorImpl(int64_t in, int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        head(register_module("head", torch::nn::Linear(hidden, 1))) {}
  at::Tensor forward(const at::Tensor& x) { return head(torch::relu(fc2(torch::relu(fc1(x))))); }

  torch::nn::Linear fc1, fc2, head;
};
TORCH_MODULE(Regressor);

/// A training/validation split of the table's rows: a permutation drawn from `seed`, the first `n_val`
/// rows of it held out; the last column is the target.
struct Split {
  at::Tensor train_x, train_y, val_x, val_y;
};

Split split_rows(const CsvTable& table, int64_t n_val, uint64_t seed) {
  const int64_t n = table.values.size(0);
  const int64_t features = table.values.size(1) - 1;
  at::Tensor order;
  {
    tk::data::ScopedSeed seeded(seed);
    order = torch::randperm(n);
  }
  const at::Tensor train_rows = table.values.index_select(0, order.slice(0, n_val));
  const at::Tensor val_rows = table.values.index_select(0, order.slice(0, 0, n_val));
  return {train_rows.slice(1, 0, features), train_rows.slice(1, features), val_rows.slice(1, 0, features),
          val_rows.slice(1, features)};
}

/// A torch::data loader that the BatchSource owns.
template <class Loader>
class OwnedTorchData : public tk::data::BatchSource {
 public:
  OwnedTorchData(std::unique_ptr<Loader> loader, tk::data::TorchDataOptions options)
      : loader_(std::move(loader)), source_(tk::data::from_torch_data(*loader_, options)) {}
  void set_epoch(int64_t epoch) override { source_.set_epoch(epoch); }
  std::optional<tk::data::Batch> next() override { return source_.next(); }
  int64_t num_batches() const override { return source_.num_batches(); }

 private:
  std::unique_ptr<Loader> loader_;
  decltype(tk::data::from_torch_data(std::declval<Loader&>(), tk::data::TorchDataOptions())) source_;
};

template <class Loader>
std::unique_ptr<tk::data::BatchSource> own(std::unique_ptr<Loader> loader, tk::data::TorchDataOptions options = {}) {
  return std::make_unique<OwnedTorchData<Loader>>(std::move(loader), options);
}

/// The CSV data set's own `[data]` key.
struct CsvOptions {
  TORCH_ARG(std::string, file) = "";
 public:
  static const tk::OptionBinding<CsvOptions>& binding() {
    static const auto b = tk::OptionBinding<CsvOptions>().bind(
        TRAINKIT_OPTION(file), tk::rule::text(),
        "The numeric CSV file: a header, then rows; the last column is the target; '#' lines are comments");
    return b;
  }
};

/// data.dataset = "csv": data.val_size rows held out (a permutation drawn from train.seed), both splits
/// standardized with the training rows' statistics, read through your own torch::data Dataset. The held-out
/// rows are the validation and the test set.
class CsvData : public tk::app::DataProvider {
 public:
  std::vector<std::string> datasets() const override { return {"csv"}; }
  std::vector<tk::app::ConfigKeys> keys() const override {
    return {tk::app::ConfigKeys::of("data", CsvOptions::binding(), "data.dataset = \"csv\"")};
  }
  tk::app::RunData load(const tk::app::DataRequest& request) const override {
    const tk::app::Config& c = request.config;
    const std::string file = tk::app::read_extra(c, "data", CsvOptions::binding()).file();
    const CsvTable table = read_csv(file);
    const int64_t n = table.values.size(0);
    const int64_t n_val = c.data.val_size;
    if (n_val < 1 || n - n_val < 1) {
      throw tk::app::ConfigError(fmt::format("{}: data.val_size = {}: {} has {} rows; hold out between 1 and {}",
                                             request.source, n_val, file, n, n - 1));
    }
    const Split split = split_rows(table, n_val, static_cast<uint64_t>(c.train.seed));
    const Standardizer scale(split.train_x);
    const auto loader = [&](const at::Tensor& x, const at::Tensor& y, bool train) {
      const int64_t rows = x.size(0);
      const int64_t batch = train ? c.train.batch_size : c.train.eval_batch_size;
      auto dataset = RegressionRows(x, y, scale).map(torch::data::transforms::Stack<>());
      auto options = tk::data::TorchDataOptions().num_batches((rows + batch - 1) / batch);
      std::unique_ptr<tk::data::BatchSource> host =
          train ? own(torch::data::make_data_loader(std::move(dataset), torch::data::samplers::RandomSampler(rows),
                                                    torch::data::DataLoaderOptions().batch_size(batch)),
                      options.seed(static_cast<uint64_t>(c.train.seed)))
                : own(torch::data::make_data_loader(std::move(dataset),
                                                    torch::data::samplers::SequentialSampler(rows),
                                                    torch::data::DataLoaderOptions().batch_size(batch)),
                      options);
      return std::make_unique<tk::data::DeviceSource>(std::shared_ptr<tk::data::BatchSource>(std::move(host)),
                                                      request.device);
    };
    tk::app::RunData run;
    run.train = loader(split.train_x, split.train_y, true);
    run.val = loader(split.val_x, split.val_y, false);
    run.test = loader(split.val_x, split.val_y, false);
    run.train_examples = n - n_val;
    run.val_examples = n_val;
    run.test_examples = n_val;
    run.info.sample_shape = {split.train_x.size(1)};
    return run;
  }
};

/// model.name = "regressor": your MLP (model.hidden wide: the image models' key, app::ImageModelOptions), trained
/// with the MSE loss.
class RegressorModel : public tk::app::ModelProvider {
 public:
  std::vector<std::string> models() const override { return {"regressor"}; }
  tk::app::ModelParts build(const tk::app::Config& config, const tk::app::DataInfo& data,
                            const std::string& source) const override {
    if (data.sample_shape.size() != 1) {
      throw tk::app::ConfigError(fmt::format("{}: model.name = \"regressor\" takes feature rows; data.dataset = "
                                             "\"{}\" gives other inputs",
                                             source, config.data.dataset));
    }
    Regressor model(data.sample_shape[0],
                    tk::app::read_extra(config, "model", tk::app::ImageModelOptions::binding()).cnn().hidden());
    return {model.ptr(), [model](const tk::data::Batch& b) mutable { return model->forward(b.input()); },
            tk::train::mse_loss()};
  }
};

struct Options {
  std::string config = std::string(TRAINKIT_SOURCE_DIR) + "/configs/custom_data.toml";
  std::vector<std::string> sets;
  std::string csv = std::string(TRAINKIT_SOURCE_DIR) + "/tests/fixtures/regression.csv";
  int64_t epochs = 60;
  double val_fraction = 0.2;
  double lr = 0;
  std::string suggestion = "valley";
  int64_t finder_iters = 100;
  std::string out;
  bool recipe = false;
  double max_val_mse = 0;
};

/// The comparison that says how good the result is: against the noise variance when the file states it.
std::string against_noise(double mse, const std::optional<double>& sigma) {
  if (!sigma) {
    return "(the file states no noise_sigma, so the irreducible error is unknown)";
  }
  const double floor = *sigma * *sigma;
  return fmt::format("= {:.2f} x the noise variance {:.4f} (sigma {:g}: no model can do better on average)",
                     mse / floor, floor, *sigma);
}

int check_bound(double mse, double bound) {
  if (bound > 0 && mse > bound) {
    fmt::print(stderr, "error: final validation MSE {:.4f} is above --max-val-mse {:.4f}\n", mse, bound);
    return tk::app::kExitFailure;
  }
  return 0;
}

int run(const Options& o) {
  const CsvTable table = read_csv(o.csv);  // for its size and noise level; the provider reads it again
  const int64_t n = table.values.size(0);
  const auto n_val = static_cast<int64_t>(std::llround(static_cast<double>(n) * o.val_fraction));
  if (n_val < 1 || n - n_val < 1) {
    throw tk::data::DataError(fmt::format("{}: {} rows cannot be split into training and validation rows with "
                                          "--val-fraction {}",
                                          o.csv, n, o.val_fraction));
  }
  const tk::app::Catalog catalog =
      tk::app::Catalog::builtin().add(std::make_shared<CsvData>()).add(std::make_shared<RegressorModel>());
  std::vector<std::string> overrides = {"data.file=" + o.csv, fmt::format("data.val_size={}", n_val),
                                        fmt::format("train.epochs={}", o.epochs)};
  overrides.insert(overrides.end(), o.sets.begin(), o.sets.end());
  const tk::app::Config config = tk::app::load_config(o.config, overrides, catalog.extensions());
  torch::set_num_threads(static_cast<int>(std::max<int64_t>(config.train.threads, 1)));

  const Split split = split_rows(table, n_val, static_cast<uint64_t>(config.train.seed));
  const double mean_baseline = (split.val_y - split.train_y.mean()).square().mean().item<double>();
  fmt::print("data     {}: {} rows, {} features -> target \"{}\"; {} training / {} validation rows (seed {})\n",
             o.csv, n, split.train_x.size(1), table.columns.back(), n - n_val, n_val, config.train.seed);
  fmt::print("baseline predicting the training mean: val MSE {:.4f}; irreducible error: {}\n", mean_baseline,
             table.noise_sigma ? fmt::format("sigma^2 = {:.4f}", *table.noise_sigma * *table.noise_sigma)
                               : std::string("unknown (no noise_sigma comment in the file)"));

  const auto start = Clock::now();
  if (o.recipe) {
    torch::manual_seed(static_cast<uint64_t>(config.train.seed));
    const Standardizer scale(split.train_x);
    const double mse = fit_regression(scale(split.train_x), split.train_y, scale(split.val_x), split.val_y, o.epochs);
    fmt::print("recipe, {} epochs: final val MSE {:.4f} {}; {:.1f} s\n", o.epochs, mse,
               against_noise(mse, table.noise_sigma), seconds_since(start));
    return check_bound(mse, o.max_val_mse);
  }

  const std::string out = o.out.empty() ? fmt::format("runs/custom_data-{}", std::time(nullptr)) : o.out;
  double lr = o.lr;
  if (lr <= 0) {
    // The LR range test's job on the same data and model (it restores both after); lr_find.csv/.svg in out.
    tk::app::LrFindJobOptions finder;
    finder.out_dir = out;
    finder.finder.num_iter(o.finder_iters);
    const auto found = tk::app::run_lr_find_job(config, o.config, finder, catalog);
    const auto chosen = std::find_if(found.suggestions.begin(), found.suggestions.end(),
                                     [&](const tk::tune::Suggestion& s) { return s.method == o.suggestion; });
    if (chosen == found.suggestions.end()) {
      throw std::runtime_error(fmt::format("the LR finder gave no {} suggestion (pass --lr)", o.suggestion));
    }
    lr = chosen->lr;
    fmt::print("lr find  {} steps{} -> OneCycleLR max_lr {:.2e} ({})\n", found.curve.lrs.size(),
               found.curve.diverged ? " (stopped: diverged)" : "", lr, o.suggestion);
  } else {
    fmt::print("lr       {:.2e} (--lr; LR finder skipped)\n", lr);
  }
  overrides.push_back(fmt::format("scheduler.max_lr={}", lr));
  const tk::app::TrainJobResult result = tk::app::run_train_job({o.config, overrides, out, "", catalog});
  const double mse = result.test_metrics.at("mse");
  fmt::print("\nfinal val MSE {:.4f} {}\n", mse, against_noise(mse, table.noise_sigma));
  fmt::print("      training-mean baseline {:.4f}; {} epochs, {:.2f} s in all; run directory {}\n", mean_baseline,
             result.epochs, seconds_since(start), result.run_dir);
  return check_bound(mse, o.max_val_mse);
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "Your own CSV data set (your torch::data Dataset) and your own LibTorch module, as a data and a model "
      "provider of trainkit's jobs: the LR finder's suggestion, then trainkit train with a 1cycle schedule and "
      "regression metrics; the validation MSE is compared with the data's noise variance"};
  Options o;
  cli.option("--config", o.config, "TOML config: trainkit train's sections (docs/config.md) and data.file")
      .show_default();
  cli.option("--set", o.sets, "Override a config key: section.key=value (repeatable)");
  cli.option("--csv", o.csv,
             "Numeric CSV: a header, then rows; the last column is the target; '#' lines are comments, "
             "one may state noise_sigma=S (= data.file)")
      .show_default();
  cli.option("--epochs", o.epochs, "Training epochs (= train.epochs)").show_default().range(1, 100000);
  cli.option("--val-fraction", o.val_fraction, "Fraction of the rows held out for validation (sets data.val_size)")
      .show_default()
      .range(0.0, 1.0);
  cli.option("--lr", o.lr, "Peak LR of the 1cycle schedule (0: the LR finder's suggestion)").show_default()
      .non_negative();
  cli.option("--suggestion", o.suggestion, "Which LR finder suggestion to train with").show_default()
      .one_of({"valley", "steepest"});
  cli.option("--finder-iters", o.finder_iters, "Steps of the LR range test").show_default().range(2, 100000);
  cli.option("--out", o.out, "Run directory (trainkit train's files, lr_find.csv/.svg); default runs/custom_data-<time>");
  cli.flag("--recipe", o.recipe,
           "Run docs/training.md's recipe (recipe.cpp) on the same split instead: its own "
           "model, batch size and LR finder; --epochs applies");
  cli.option("--max-val-mse", o.max_val_mse, "Exit 1 when the final validation MSE is above this (0: no check)")
      .show_default()
      .non_negative();
  if (auto rc = cli.parse(argc, argv)) return *rc;
  tk::app::set_log_level("info");
  return tk::app::run_main([&] { return run(o); });
}
