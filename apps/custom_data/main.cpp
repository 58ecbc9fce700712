// custom_data: trainkit inside your own LibTorch project. Your CSV file becomes your own
// torch::data Dataset (features standardized with the training split's statistics), a torch::data loader
// feeds trainkit through data::from_torch_data, and your own MLP is trained by the LR finder's suggestion,
// the Trainer, a 1cycle schedule and the MSE/MAE metrics. The validation MSE is printed next to the
// data's noise variance, the error no model can beat. `--recipe` runs README's short version instead.
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
#include "trainkit/app/main.h"
#include "trainkit/data.h"
#include "trainkit/log.h"
#include "trainkit/sched.h"
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

/// Prints one table row every `every` epochs (and the last), and writes every epoch to `metrics`.
class EpochTable : public tk::train::Callback {
 public:
  EpochTable(int64_t every, int64_t epochs, std::shared_ptr<tk::log::MetricsWriter> metrics)
      : every_(every), epochs_(epochs), metrics_(std::move(metrics)) {}
  void on_train_begin(tk::train::Trainer&) override { start_ = Clock::now(); }
  bool on_epoch_end(tk::train::Trainer& trainer, const tk::train::EpochEvent& e) override {
    const double lr = trainer.optimizer().param_groups().front().options().get_lr();
    const auto& val = e.val.value();
    if (metrics_) {
      tk::log::MetricRow row;
      row.kind = "epoch";
      row.step = e.step;
      row.epoch = e.epoch;
      row.loss = e.train_loss;
      row.lr = lr;
      row.val_loss = val.loss;
      row.val_metrics = {{"mse", val.metric("mse")}, {"mae", val.metric("mae")}};
      metrics_->write(row);
    }
    if ((e.epoch + 1) % every_ == 0 || e.epoch + 1 == epochs_) {
      fmt::print("{:>6} {:>10.2e} {:>10.4f} {:>10.4f} {:>10.4f} {:>8.2f}\n", e.epoch + 1, lr, e.train_loss,
                 val.metric("mse"), val.metric("mae"), seconds_since(start_));
    }
    return false;
  }

 private:
  int64_t every_;
  int64_t epochs_;
  std::shared_ptr<tk::log::MetricsWriter> metrics_;
  Clock::time_point start_;
};

struct Options {
  std::string csv = std::string(TRAINKIT_SOURCE_DIR) + "/tests/fixtures/regression.csv";
  int64_t epochs = 60;
  int64_t batch_size = 32;
  int64_t hidden = 64;
  double val_fraction = 0.2;
  uint64_t seed = 0;
  double lr = 0;
  std::string suggestion = "valley";
  int64_t finder_iters = 100;
  int threads = 1;
  int64_t print_every = 0;
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
  torch::set_num_threads(o.threads);
  torch::manual_seed(o.seed);
  const CsvTable table = read_csv(o.csv);
  const int64_t n = table.values.size(0);
  const int64_t features = table.values.size(1) - 1;
  const auto n_val = static_cast<int64_t>(std::llround(static_cast<double>(n) * o.val_fraction));
  if (n_val < 1 || n - n_val < 1) {
    throw tk::data::DataError(fmt::format("{}: {} rows cannot be split into training and validation rows with "
                                          "--val-fraction {}",
                                          o.csv, n, o.val_fraction));
  }
  at::Tensor order;
  {
    tk::data::ScopedSeed seeded(o.seed);
    order = torch::randperm(n);
  }
  const at::Tensor train_rows = table.values.index_select(0, order.slice(0, n_val));
  const at::Tensor val_rows = table.values.index_select(0, order.slice(0, 0, n_val));
  const at::Tensor train_x = train_rows.slice(1, 0, features), train_y = train_rows.slice(1, features);
  const at::Tensor val_x = val_rows.slice(1, 0, features), val_y = val_rows.slice(1, features);
  const Standardizer scale(train_x);
  const double mean_baseline = (val_y - train_y.mean()).square().mean().item<double>();

  fmt::print("data     {}: {} rows, {} features -> target \"{}\"; {} training / {} validation rows (seed {})\n",
             o.csv, n, features, table.columns.back(), n - n_val, n_val, o.seed);
  fmt::print("baseline predicting the training mean: val MSE {:.4f}; irreducible error: {}\n", mean_baseline,
             table.noise_sigma ? fmt::format("sigma^2 = {:.4f}", *table.noise_sigma * *table.noise_sigma)
                               : std::string("unknown (no noise_sigma comment in the file)"));

  const auto start = Clock::now();
  if (o.recipe) {
    const double mse = fit_regression(scale(train_x), train_y, scale(val_x), val_y, o.epochs);
    fmt::print("README recipe, {} epochs: final val MSE {:.4f} {}; {:.1f} s\n", o.epochs, mse,
               against_noise(mse, table.noise_sigma), seconds_since(start));
    return check_bound(mse, o.max_val_mse);
  }

  // Your data through torch::data, handed to trainkit as a BatchSource.
  auto train_loader = torch::data::make_data_loader(
      RegressionRows(train_x, train_y, scale).map(torch::data::transforms::Stack<>()),
      torch::data::samplers::RandomSampler(n - n_val), torch::data::DataLoaderOptions().batch_size(o.batch_size));
  auto val_loader = torch::data::make_data_loader(
      RegressionRows(val_x, val_y, scale).map(torch::data::transforms::Stack<>()),
      torch::data::samplers::SequentialSampler(n_val), torch::data::DataLoaderOptions().batch_size(256));
  const int64_t steps_per_epoch = (n - n_val + o.batch_size - 1) / o.batch_size;
  auto train = tk::data::from_torch_data(*train_loader,
                                         tk::data::TorchDataOptions().seed(o.seed).num_batches(steps_per_epoch));
  auto val = tk::data::from_torch_data(*val_loader);

  // Your module, with a forward over trainkit's Batch (any number of inputs would fit here).
  Regressor model(features, o.hidden);
  tk::train::ForwardFn forward = [model](const tk::data::Batch& b) mutable { return model->forward(b.input()); };
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));

  double lr = o.lr;
  std::optional<tk::tune::LRFinderResult> curve;
  std::vector<tk::tune::Suggestion> suggestions;
  if (lr <= 0) {
    const auto finder_start = Clock::now();
    tk::tune::LRFinder finder(model.ptr(), forward, optimizer, tk::train::mse_loss());
    curve = finder.range_test(train, nullptr, tk::tune::LRFinderOptions().num_iter(o.finder_iters));
    std::string why_valley, why_steepest;
    const auto valley = tk::tune::suggest_valley(*curve, &why_valley);
    const auto steepest = tk::tune::suggest_steepest(*curve, &why_steepest);
    for (const auto& s : {valley, steepest}) {
      if (s) {
        suggestions.push_back(*s);
      }
    }
    const auto& chosen = o.suggestion == "valley" ? valley : steepest;
    if (!chosen) {
      throw std::runtime_error(fmt::format("the LR finder gave no {} suggestion: {} (pass --lr)", o.suggestion,
                                           o.suggestion == "valley" ? why_valley : why_steepest));
    }
    lr = chosen->lr;
    fmt::print("lr find  {} steps{} in {:.2f} s: valley {}, steepest {} -> OneCycleLR max_lr {:.2e} ({})\n",
               curve->lrs.size(), curve->diverged ? " (stopped: diverged)" : "", seconds_since(finder_start),
               valley ? fmt::format("{:.2e}", valley->lr) : "none",
               steepest ? fmt::format("{:.2e}", steepest->lr) : "none", lr, o.suggestion);
  } else {
    fmt::print("lr       {:.2e} (--lr; LR finder skipped)\n", lr);
  }

  std::shared_ptr<tk::log::MetricsWriter> metrics;
  if (!o.out.empty()) {
    std::filesystem::create_directories(o.out);
    metrics = std::make_shared<tk::log::MetricsWriter>(o.out, false, std::vector<std::string>{"mse", "mae"});
    if (curve) {
      tk::tune::write_lr_finder_csv(*curve, o.out + "/lr_find.csv");
      tk::tune::write_lr_finder_svg(*curve, suggestions, o.out + "/lr_find.svg", "custom_data: LR range test");
    }
  }

  tk::train::Trainer trainer(model.ptr(), forward, optimizer, tk::train::TrainerOptions().epochs(o.epochs));
  trainer.set_loss(tk::train::mse_loss());
  trainer.set_metrics({tk::train::mean_squared_error(), tk::train::mean_absolute_error()});
  trainer.set_scheduler(std::make_shared<tk::sched::OneCycleLR>(
                            optimizer, tk::sched::OneCycleLROptions({lr}).epochs(o.epochs).steps_per_epoch(
                                           steps_per_epoch)),
                        /*per_step=*/true);
  const int64_t every = o.print_every > 0 ? o.print_every : std::max<int64_t>(1, o.epochs / 10);
  trainer.add_callback(std::make_shared<EpochTable>(every, o.epochs, metrics));

  const auto untrained = trainer.evaluate(val);
  fmt::print("\n{:>6} {:>10} {:>10} {:>10} {:>10} {:>8}\n", "epoch", "lr", "train mse", "val mse", "val mae",
             "seconds");
  fmt::print("{:>6} {:>10} {:>10} {:>10.4f} {:>10.4f} {:>8}\n", 0, "-", "-", untrained.metric("mse"),
             untrained.metric("mae"), "-");
  const auto train_start = Clock::now();
  trainer.fit(train, &val);
  const double train_seconds = seconds_since(train_start);
  const auto final_result = trainer.evaluate(val);
  const double mse = final_result.metric("mse");
  fmt::print("\nfinal val MSE {:.4f} {}\n", mse, against_noise(mse, table.noise_sigma));
  fmt::print("      untrained {:.4f}, training-mean baseline {:.4f}; {} epochs in {:.2f} s, {:.2f} s in all\n",
             untrained.metric("mse"), mean_baseline, o.epochs, train_seconds, seconds_since(start));
  if (metrics) {
    metrics.reset();  // flush and close before drawing
    tk::log::write_curves_svg(o.out + "/metrics.csv", o.out + "/curves.svg", "custom_data: " + o.csv);
    fmt::print("wrote {0}/metrics.csv, {0}/metrics.jsonl, {0}/curves.svg{1}\n", o.out,
               curve ? fmt::format(", {0}/lr_find.csv, {0}/lr_find.svg", o.out) : "");
  }
  return check_bound(mse, o.max_val_mse);
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "Your own CSV data set and your own LibTorch module, trained with trainkit's LR finder, Trainer, "
      "1cycle schedule and regression metrics; the validation MSE is compared with the data's noise "
      "variance"};
  Options o;
  cli.option("--csv", o.csv,
             "Numeric CSV: a header, then rows; the last column is the target; '#' lines are comments, "
             "one may state noise_sigma=S")
      .show_default();
  cli.option("--epochs", o.epochs, "Training epochs").show_default().range(1, 100000);
  cli.option("--batch-size", o.batch_size, "Training batch size").show_default().range(1, 1 << 20);
  cli.option("--hidden", o.hidden, "Width of the MLP's two hidden layers").show_default().range(1, 1 << 16);
  cli.option("--val-fraction", o.val_fraction, "Fraction of the rows held out for validation").show_default()
      .range(0.0, 1.0);
  cli.option("--seed", o.seed, "Seed of the split, the initialization and the batch order").show_default();
  cli.option("--lr", o.lr, "Peak LR of the 1cycle schedule (0: the LR finder's suggestion)").show_default()
      .non_negative();
  cli.option("--suggestion", o.suggestion, "Which LR finder suggestion to train with").show_default()
      .one_of({"valley", "steepest"});
  cli.option("--finder-iters", o.finder_iters, "Steps of the LR range test").show_default().range(2, 100000);
  cli.option("--threads", o.threads,
             "Intra-op threads (ops of a small MLP on batches of 32 are too small to be worth splitting)")
      .show_default()
      .range(1, 1024);
  cli.option("--print-every", o.print_every, "Print every N epochs (0: about ten rows)").show_default();
  cli.option("--out", o.out, "Directory for metrics.csv/.jsonl, curves.svg and lr_find.csv/.svg (optional)");
  cli.flag("--recipe", o.recipe,
           "Run README's \"Using the library\" recipe (recipe.cpp) on the same split instead: its own "
           "model, batch size and LR finder; --epochs applies");
  cli.option("--max-val-mse", o.max_val_mse, "Exit 1 when the final validation MSE is above this (0: no check)")
      .show_default()
      .non_negative();
  if (auto rc = cli.parse(argc, argv)) return *rc;
  tk::app::set_log_level("info");
  return tk::app::run_main([&] { return run(o); });
}
