// bench_trainer: training throughput of the same model, data, data order and optimizer three ways, side
// by side in one run: a hand-written LibTorch loop, trainkit's Trainer, and Python PyTorch from the
// project's virtual environment (scripts/bench_trainer_peer.py). With --loader torch_data, the hand loop
// iterates a torch::data loader (MnistDataset + Stack, RandomSampler) and the Trainer reads the same
// loader through data::from_torch_data (the Python peer is skipped). Rounds alternate the variants so that
// machine noise hits all of them alike; the table reports each variant's median round and
// its best round (the least disturbed by other load), both as ratios to the hand-written loop.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/data/torch_data.h"
#include "trainkit/nn/models.h"
#include "trainkit/log/metrics.h"
#include "trainkit/log/mlflow.h"
#include "trainkit/log/summary_writer.h"
#include "trainkit/train/callbacks/metrics_logger.h"
#include "trainkit/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string g_model = "cnn";  // set from --model before any Setup is built

struct Setup {
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Adam> optimizer;
  Setup() {
    torch::manual_seed(0);
    model = g_model == "mlp" ? trainkit::nn::make_mlp() : trainkit::nn::make_cnn();
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-3));
  }
};

double hand_loop(trainkit::data::TensorLoader& loader, int64_t steps) {
  Setup s;
  s.model->train();
  loader.set_epoch(0);
  const auto start = Clock::now();
  for (int64_t b = 0; b < steps; ++b) {
    const auto batch = loader.batch(b % loader.num_batches());
    s.optimizer->zero_grad();
    const at::Tensor loss = torch::nn::functional::cross_entropy(s.model->forward(batch.input()), batch.target());
    loss.backward();
    s.optimizer->step();
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// The Trainer alone: no hooks, and the step-time profile off.
double trainer_loop(trainkit::data::TensorLoader& loader, int64_t steps) {
  Setup s;
  trainkit::train::Trainer trainer(s.model, *s.optimizer,
                                   trainkit::train::TrainerOptions().max_steps(steps).epochs(1000).profile(false));
  const auto start = Clock::now();
  trainer.fit(loader);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// The Trainer with what `trainkit train` adds for monitoring: the step-time profile, and the logging hook
/// writing metrics.csv/jsonl and TensorBoard monitors (loss, every group's LR and beta1, throughput) every
/// `monitor_every` steps, 10x as often as the main job's default of 100.
// What the MLflow sink costs the training thread: seconds inside it, and rows passed, over all rounds.
double g_mlflow_sink_seconds = 0;
int64_t g_mlflow_rows = 0;

/// With `mlflow_uri`, the same rows also go to that MLflow server (a new run each time; its final flush,
/// which a run does once at its end, is outside the timed loop).
double trainer_loop_monitored(trainkit::data::TensorLoader& loader, int64_t steps, const std::string& dir,
                              int64_t monitor_every, const std::string& mlflow_uri = "") {
  Setup s;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  trainkit::train::Trainer trainer(s.model, *s.optimizer,
                                   trainkit::train::TrainerOptions().max_steps(steps).epochs(1000).profile(true));
  auto metrics = std::make_shared<trainkit::log::MetricsWriter>(dir, false);
  auto tensorboard = std::make_shared<trainkit::log::SummaryWriter>(dir);
  std::shared_ptr<trainkit::log::MlflowLogger> mlflow;
  if (!mlflow_uri.empty()) {
    trainkit::log::MlflowLoggerOptions options;
    options.tracking_uri = mlflow_uri;
    options.experiment = "bench_trainer";
    mlflow = std::make_shared<trainkit::log::MlflowLogger>(options);
    metrics->add_sink([mlflow](const trainkit::log::MetricRow& row) {
      const auto start = Clock::now();
      mlflow->log_metrics(trainkit::log::mlflow_metrics(row));
      g_mlflow_sink_seconds += std::chrono::duration<double>(Clock::now() - start).count();
      ++g_mlflow_rows;
    });
  }
  trainer.add_callback(std::make_shared<trainkit::train::MetricsLogger>(metrics, monitor_every, false, tensorboard));
  const auto start = Clock::now();
  trainer.fit(loader);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  tensorboard->close();
  if (mlflow) {
    const auto sent = mlflow->finish();
    if (sent.metrics_unsent + sent.metrics_dropped > 0) {
      throw std::runtime_error(fmt::format("MLflow server {}: {} points not sent", mlflow_uri,
                                           sent.metrics_unsent + sent.metrics_dropped));
    }
  }
  return seconds;
}

using TorchLoader = decltype(torch::data::make_data_loader(
    std::declval<trainkit::data::MnistDataset>().map(torch::data::transforms::Stack<>()),
    torch::data::samplers::RandomSampler(0), torch::data::DataLoaderOptions()));

double hand_loop_torch_data(TorchLoader& loader, int64_t steps) {
  Setup s;
  s.model->train();
  const auto start = Clock::now();
  int64_t b = 0;
  while (b < steps) {
    for (auto& batch : *loader) {
      if (b++ == steps) {
        break;
      }
      s.optimizer->zero_grad();
      const at::Tensor loss = torch::nn::functional::cross_entropy(s.model->forward(batch.data), batch.target);
      loss.backward();
      s.optimizer->step();
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double trainer_loop_torch_data(TorchLoader& loader, int64_t steps) {
  Setup s;
  auto source = trainkit::data::from_torch_data(*loader);
  trainkit::train::Trainer trainer(s.model, *s.optimizer, trainkit::train::TrainerOptions().max_steps(steps).epochs(1000));
  const auto start = Clock::now();
  trainer.fit(source);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Runs the Python peer once; returns its seconds for `steps` steps (it times only its loop).
double python_loop(const std::string& python, const std::string& data_dir, int64_t steps, int64_t batch) {
  const std::string out = fmt::format("/tmp/trainkit-bench-peer-{}.txt", ::getpid());
  const std::string cmd = fmt::format("{} {}/scripts/bench_trainer_peer.py --data-dir {} --steps {} --batch-size {} --model {} > {}",
                                      python, TRAINKIT_SOURCE_DIR, data_dir, steps, batch, g_model, out);
  if (std::system(cmd.c_str()) != 0) {
    throw std::runtime_error("python peer failed: " + cmd);
  }
  std::ifstream in(out);
  double seconds = -1;
  in >> seconds;
  std::remove(out.c_str());
  if (seconds <= 0) {
    throw std::runtime_error("python peer printed no time: " + cmd);
  }
  return seconds;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "Trainer throughput vs a hand-written LibTorch loop vs Python PyTorch (same model, data, order)"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string python = std::string(TRAINKIT_SOURCE_DIR) + "/.venv/bin/python";
  std::string json_path;
  int64_t steps = 40;
  int64_t batch = 128;
  int rounds = 15;
  bool no_python = false;
  cli.option("--data-dir", data_dir, "Fashion-MNIST directory").show_default();
  cli.option("--steps", steps, "Optimizer steps per measurement").show_default();
  cli.option("--batch-size", batch, "Batch size").show_default();
  cli.option("--rounds", rounds, "Alternating rounds; the median is reported").show_default();
  cli.option("--python", python, "Python with the pinned torch (the peer)").show_default();
  cli.option("--model", g_model, "cnn (trainkit::nn::make_cnn) or mlp (make_mlp: 784-256-10)").show_default()
      .one_of({"cnn", "mlp"});
  cli.flag("--no-python", no_python, "Skip the Python peer");
  std::string loader_kind = "tensor";
  cli.option("--loader", loader_kind,
             "tensor (TensorLoader over preloaded tensors) or torch_data (a torch::data loader; no Python peer)")
      .show_default()
      .one_of({"tensor", "torch_data"});
  cli.option("--json", json_path, "Also write the results as JSON to this file");
  std::string mlflow_uri;
  cli.option("--mlflow-uri", mlflow_uri,
             "Also run the monitored variant logging to this MLflow server (http://host:port), and compare");
  int64_t monitor_every = 10;
  cli.option("--monitor-every", monitor_every,
             "Steps between monitor rows in the 'Trainer + profile + monitors' variant")
      .show_default()
      .positive();
  if (auto rc = cli.parse(argc, argv)) return *rc;

  const auto train = trainkit::data::load_mnist_split(data_dir, true);
  trainkit::data::TensorLoader loader(train.images, train.labels,
                                      trainkit::data::TensorLoaderOptions().batch_size(batch).seed(0));
  hand_loop(loader, 20);  // warm up allocator and oneDNN primitives
  const bool torch_data = loader_kind == "torch_data";
  TorchLoader torch_loader = torch::data::make_data_loader(
      trainkit::data::MnistDataset(train).map(torch::data::transforms::Stack<>()),
      torch::data::samplers::RandomSampler(train.images.size(0)), torch::data::DataLoaderOptions().batch_size(batch));

  std::map<std::string, std::vector<double>> seconds;
  std::vector<std::pair<std::string, std::function<double()>>> variants = {
      {"hand-written LibTorch loop", [&] { return hand_loop(loader, steps); }},
      {"trainkit Trainer", [&] { return trainer_loop(loader, steps); }},
      {"Python PyTorch (same wheel)", [&] { return python_loop(python, data_dir, steps, batch); }},
      {"Trainer + profile + monitors", [&] {
         return trainer_loop_monitored(loader, steps, fmt::format("/tmp/trainkit-bench-monitors-{}", ::getpid()),
                                       monitor_every);
       }},
      {"... + MLflow", [&] {
         return trainer_loop_monitored(loader, steps, fmt::format("/tmp/trainkit-bench-mlflow-{}", ::getpid()),
                                       monitor_every, mlflow_uri);
       }},
  };
  if (torch_data) {
    variants[0].second = [&] { return hand_loop_torch_data(torch_loader, steps); };
    variants[1].second = [&] { return trainer_loop_torch_data(torch_loader, steps); };
  }
  // The monitored variant needs the tensor loader; the Python peer is skipped on request and with torch_data.
  std::vector<size_t> active = {0, 1};
  if (!torch_data) {
    active.push_back(3);
    if (!mlflow_uri.empty()) active.push_back(4);
  }
  if (!no_python && !torch_data) {
    active.push_back(2);
  }
  const size_t count = active.size();
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < count; ++i) {  // rotate the order each round
      const auto& [name, run] = variants[active[(i + static_cast<size_t>(r)) % count]];
      seconds[name].push_back(run());
    }
  }
  const double hand = median(seconds["hand-written LibTorch loop"]);
  const double hand_best = *std::min_element(seconds["hand-written LibTorch loop"].begin(),
                                             seconds["hand-written LibTorch loop"].end());
  fmt::print("Fashion-MNIST {}, Adam, batch {}, {} steps per round, {} threads, {} alternating rounds, {} loader\n",
             g_model, batch, steps, torch::get_num_threads(), rounds, loader_kind);
  fmt::print("{:<30} {:>12} {:>12} {:>14} {:>14}\n", "variant", "median s", "samples/s", "median ratio",
             "best ratio");
  std::string json = "{";
  for (const char* name : {"hand-written LibTorch loop", "trainkit Trainer", "Trainer + profile + monitors",
                           "... + MLflow", "Python PyTorch (same wheel)"}) {
    if (seconds.count(name) == 0) {
      continue;
    }
    const double s = median(seconds[name]);
    const double best = *std::min_element(seconds[name].begin(), seconds[name].end());
    const double rate = static_cast<double>(steps * batch) / s;
    fmt::print("{:<30} {:>12.3f} {:>12.0f} {:>14.3f} {:>14.3f}\n", name, s, rate, s / hand, best / hand_best);
    json += fmt::format(
        "{}\"{}\": {{\"median_seconds\": {:.4f}, \"best_seconds\": {:.4f}, \"samples_per_second\": {:.1f}, "
        "\"median_ratio_to_hand_loop\": {:.4f}, \"best_ratio_to_hand_loop\": {:.4f}}}",
        json.size() > 1 ? ", " : "", name, s, best, rate, s / hand, best / hand_best);
  }
  // Per round, a variant against its base of the same round: the pairs share the machine's state, so their
  // ratio is steadier than a ratio of medians. Prints and returns the median of those ratios.
  const auto compare = [&](const std::string& what, const std::string& variant, const std::string& base) {
    const auto& v = seconds[variant];
    const auto& b = seconds[base];
    std::vector<double> ratios;
    for (size_t i = 0; i < b.size(); ++i) {
      ratios.push_back(v[i] / b[i]);
    }
    fmt::print("{} every {} steps: median of per-round ratios {:.4f}, ratio of best rounds {:.4f}\n", what,
               monitor_every, median(ratios), *std::min_element(v.begin(), v.end()) / *std::min_element(b.begin(), b.end()));
    return median(ratios);
  };
  if (seconds.count("Trainer + profile + monitors") != 0) {
    json += fmt::format(", \"monitor_overhead_median_ratio\": {:.4f}",
                        compare("profile + monitors vs the Trainer alone", "Trainer + profile + monitors",
                                "trainkit Trainer"));
  }
  if (seconds.count("... + MLflow") != 0) {
    const double ratio =
        compare("MLflow tracking vs the same monitors without it", "... + MLflow", "Trainer + profile + monitors");
    const auto& monitored = seconds["Trainer + profile + monitors"];
    const double per_row_us = 1e6 * g_mlflow_sink_seconds / static_cast<double>(std::max<int64_t>(g_mlflow_rows, 1));
    const double step_s = median(monitored) / static_cast<double>(steps);
    fmt::print("MLflow in the training thread: {:.1f} us per row sent ({} rows), {:.5f}% of a {:.1f} ms step at one "
               "row every {} steps\n",
               per_row_us, g_mlflow_rows, 100.0 * per_row_us * 1e-6 / (step_s * static_cast<double>(monitor_every)),
               1e3 * step_s, monitor_every);
    json += fmt::format(", \"mlflow_overhead_median_ratio\": {:.4f}, \"mlflow_sink_us_per_row\": {:.2f}", ratio,
                        per_row_us);
  }
  json += "}\n";
  if (!json_path.empty()) {
    std::ofstream(json_path) << json;
  }
  return 0;
}
