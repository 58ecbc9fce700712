// bench_ddp: data-parallel scaling of the Fashion-MNIST CNN on this machine, in one run:
//   strong scaling: 1 rank x 1 thread vs 2 ranks x 1 thread at the same global batch B (each rank B/2);
//   weak scaling (the DDP paper's method): the same per-rank batch B/2 on 1 rank and on each of 2 ranks;
//   samples/s and scaling efficiency, with the all-reduce overlapped with backward (autograd hooks) and
//   after backward;
//   and all-reduce throughput of the same bytes sent per tensor, in DDP's 25 MiB buckets, and as one flat
//   buffer. The driver starts itself as the ranks through trainkit::dist::launch (`--worker ...`).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/launch.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/nn/models.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::map<std::string, double> read_results(const std::string& path) {
  std::map<std::string, double> out;
  std::ifstream in(path);
  std::string key;
  double value = 0;
  while (in >> key >> value) out[key] = value;
  return out;
}

/// Trains `steps` timed steps (after `warmup`) and writes "samples_per_s X" (rank 0).
void worker_train(const std::string& data_dir, int64_t limit, int64_t batch_size, int64_t warmup, int64_t steps,
                  bool overlap, const std::string& result) {
  torch::set_num_threads(1);
  auto pg = trainkit::dist::ProcessGroup::from_env();
  const int64_t world = pg->world_size();
  const auto train = trainkit::data::load_mnist_split(data_dir, true, limit);
  trainkit::data::TensorLoader loader(
      train.images, train.labels,
      trainkit::data::TensorLoaderOptions().batch_size(batch_size / world).num_replicas(world).rank(pg->rank()));
  torch::manual_seed(0);
  auto model = trainkit::nn::make_cnn();
  trainkit::dist::DistributedDataParallel ddp(model.ptr(), pg,
                                              trainkit::dist::DistributedDataParallelOptions().overlap(overlap));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto run = [&](int64_t n, int64_t first) {
    for (int64_t i = 0; i < n; ++i) {
      const auto batch = loader.batch((first + i) % loader.num_batches());
      opt.zero_grad();
      torch::nn::functional::cross_entropy(model->forward(batch.input()), batch.target()).backward();
      opt.step();
    }
  };
  run(warmup, 0);
  pg->barrier();
  const auto start = Clock::now();
  run(steps, warmup);
  pg->barrier();
  const double s = seconds_since(start);
  if (pg->is_main()) {
    std::ofstream(result) << "samples_per_s " << static_cast<double>(steps * batch_size) / s << "\n";
  }
}

/// All-reduce of `sizes` (float32 elements per tensor): per tensor, in 25 MiB buckets, one flat buffer.
void worker_allreduce(const std::vector<int64_t>& sizes, int64_t repeats, const std::string& prefix,
                      const std::string& result) {
  torch::set_num_threads(1);
  auto pg = trainkit::dist::ProcessGroup::from_env();
  std::vector<at::Tensor> grads;
  int64_t total = 0;
  for (auto n : sizes) {
    grads.push_back(torch::randn({n}));
    total += n;
  }
  at::Tensor flat = torch::randn({total});
  std::vector<at::Tensor> params;
  for (auto& g : grads) params.push_back(g);
  const auto buckets = trainkit::dist::compute_bucket_assignment(params, 1.0, 25.0);
  std::map<std::string, std::vector<double>> times;
  for (int64_t r = 0; r < repeats + 1; ++r) {
    pg->barrier();
    auto t = Clock::now();
    {
      std::vector<trainkit::dist::Work> works;
      for (auto& g : grads) works.push_back(pg->all_reduce(g));
      for (auto& w : works) w.wait();
    }
    const double per_tensor = seconds_since(t);
    pg->barrier();
    t = Clock::now();
    {
      std::vector<std::pair<at::Tensor, trainkit::dist::Work>> works;
      for (const auto& b : buckets) {
        std::vector<at::Tensor> parts;
        for (auto i : b) parts.push_back(grads[static_cast<size_t>(i)].view({-1}));
        at::Tensor buffer = torch::cat(parts);
        works.emplace_back(buffer, pg->all_reduce(buffer));
      }
      for (size_t k = 0; k < buckets.size(); ++k) {
        works[k].second.wait();
        int64_t offset = 0;
        for (auto i : buckets[k]) {
          auto& g = grads[static_cast<size_t>(i)];
          g.copy_(works[k].first.narrow(0, offset, g.numel()));
          offset += g.numel();
        }
      }
    }
    const double bucketed = seconds_since(t);
    pg->barrier();
    t = Clock::now();
    pg->all_reduce(flat).wait();
    const double one = seconds_since(t);
    if (r > 0) {  // the first round sets up connections and buffers
      times["per_tensor"].push_back(per_tensor);
      times["bucketed"].push_back(bucketed);
      times["flat"].push_back(one);
    }
  }
  if (pg->is_main()) {
    std::ofstream out(result);
    for (auto& [k, v] : times) out << prefix << "_" << k << " " << median(v) << "\n";
    out << prefix << "_bytes " << total * 4 << "\n" << prefix << "_buckets " << buckets.size() << "\n";
  }
}

std::string self_path() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "DDP scaling of the Fashion-MNIST CNN: 1 vs 2 ranks (1 thread each), strong (same global batch) "
      "and weak (same per-rank batch) scaling, overlap on/off, and all-reduce per tensor vs bucketed vs flat"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t limit = 16384;
  int64_t batch_size = 128;
  int64_t warmup = 5;
  int64_t steps = 60;
  int64_t repeats = 10;
  int64_t rounds = 3;
  std::string json;
  std::string worker;
  bool overlap = true;
  std::string result;
  std::string prefix;
  std::vector<int64_t> sizes;
  cli.option("--data-dir", data_dir, "Fashion-MNIST directory").show_default();
  cli.option("--limit-train", limit, "Training examples loaded").show_default();
  cli.option("--batch-size", batch_size,
             "Global batch of the strong-scaling rows; weak scaling uses half of it per rank")
      .show_default()
      .range(int64_t{2}, int64_t{1} << 20);
  cli.option("--warmup", warmup, "Untimed steps first").show_default();
  cli.option("--steps", steps, "Timed steps").show_default();
  cli.option("--repeats", repeats, "All-reduce rounds (median)").show_default();
  cli.option("--rounds", rounds, "Rounds of the training configurations (median)").show_default().positive();
  cli.option("--json", json, "Also write the results as JSON here");
  cli.option("--worker", worker, "(internal) run as a rank: train or allreduce");
  cli.option("--overlap", overlap, "(internal) overlap for --worker train");
  cli.option("--result", result, "(internal) result file of rank 0");
  cli.option("--prefix", prefix, "(internal) result key prefix");
  cli.option("--sizes", sizes, "(internal) tensor sizes for --worker allreduce");
  if (auto rc = cli.parse(argc, argv)) return *rc;

  try {
    if (worker == "train") {
      worker_train(data_dir, limit, batch_size, warmup, steps, overlap, result);
      return 0;
    }
    if (worker == "allreduce") {
      worker_allreduce(sizes, repeats, prefix, result);
      return 0;
    }
    const std::string tmp =
        (std::filesystem::temp_directory_path() / ("bench_ddp-" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(tmp);
    std::map<std::string, double> results;
    auto run = [&](int64_t nproc, std::vector<std::string> args) {
      const std::string file = tmp + "/result.txt";
      std::filesystem::remove(file);
      args.insert(args.begin(), self_path());
      args.insert(args.end(), {"--result", file});
      trainkit::dist::LaunchOptions options;
      options.nproc(nproc).master_port(0).command(args).prefix_output(true);
      if (trainkit::dist::launch(options) != 0) throw std::runtime_error("a benchmark rank failed");
      for (auto& [k, v] : read_results(file)) results[k] = v;
    };
    const std::vector<std::string> common = {"--data-dir", data_dir, "--limit-train", std::to_string(limit),
                                             "--warmup", std::to_string(warmup), "--steps", std::to_string(steps)};
    struct Config {
      std::string name;
      int64_t nproc;
      bool overlap;
      int64_t global_batch;
    };
    const int64_t per_rank = batch_size / 2;
    const std::vector<Config> configs = {
        {"1 rank x 1 thread, batch " + std::to_string(batch_size), 1, true, batch_size},
        {"1 rank x 1 thread, batch " + std::to_string(per_rank), 1, true, per_rank},
        {"2 ranks x 1 thread x batch " + std::to_string(per_rank) + ", overlap on", 2, true, 2 * per_rank},
        {"2 ranks x 1 thread x batch " + std::to_string(per_rank) + ", overlap off", 2, false, 2 * per_rank}};
    // Rounds interleave the configurations, so that a change in the machine's load hits them alike.
    std::vector<std::vector<double>> rates(configs.size());
    for (int64_t round = 0; round < rounds; ++round) {
      for (size_t i = 0; i < configs.size(); ++i) {
        auto args = common;
        args.insert(args.begin(), {"--worker", "train", "--overlap", configs[i].overlap ? "true" : "false"});
        args.insert(args.end(), {"--batch-size", std::to_string(configs[i].global_batch)});
        run(configs[i].nproc, args);
        rates[i].push_back(results.at("samples_per_s"));
      }
    }
    std::vector<double> train_rates;
    for (const auto& r : rates) train_rates.push_back(median(r));
    // The CNN's gradient tensors, and many small tensors.
    std::vector<std::string> cnn_sizes;
    {
      auto model = trainkit::nn::make_cnn();
      for (const auto& p : model->parameters()) cnn_sizes.push_back(std::to_string(p.numel()));
    }
    std::vector<std::string> small_sizes(256, std::to_string(16384));
    const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {{"cnn", cnn_sizes},
                                                                                 {"small", small_sizes}};
    for (const auto& [name, sz] : cases) {
      std::vector<std::string> args = {"--worker", "allreduce", "--repeats", std::to_string(repeats), "--prefix", name,
                                       "--sizes"};
      args.insert(args.end(), sz.begin(), sz.end());
      run(2, args);
    }

    std::printf("\nbench_ddp: Fashion-MNIST CNN, %lld timed steps, Adam, Gloo on loopback\n",
                static_cast<long long>(steps));
    std::printf("(median of %lld interleaved rounds; min-max in brackets)\n", static_cast<long long>(rounds));
    std::printf("| configuration | samples/s | strong: vs 1 rank at batch %lld | strong efficiency | weak: vs 1 rank "
                "at batch %lld | weak efficiency |\n|---|---:|---:|---:|---:|---:|\n",
                static_cast<long long>(batch_size), static_cast<long long>(per_rank));
    // Strong scaling compares with configuration 0 (the same global batch), weak scaling with configuration
    // 1 (the same per-rank batch); efficiency = speedup / ranks.
    std::vector<double> strong(configs.size()), weak(configs.size());
    for (size_t i = 0; i < configs.size(); ++i) {
      strong[i] = train_rates[i] / train_rates[0] / static_cast<double>(configs[i].nproc);
      weak[i] = train_rates[i] / train_rates[1] / static_cast<double>(configs[i].nproc);
      const bool strong_row = configs[i].global_batch == batch_size;
      const bool weak_row = configs[i].global_batch / configs[i].nproc == per_rank;
      std::printf("| %s | %.0f [%.0f-%.0f] | %s | %s | %s | %s |\n", configs[i].name.c_str(), train_rates[i],
                  *std::min_element(rates[i].begin(), rates[i].end()), *std::max_element(rates[i].begin(), rates[i].end()),
                  strong_row ? fmt::format("{:.2f}x", train_rates[i] / train_rates[0]).c_str() : "",
                  strong_row ? fmt::format("{:.2f}", strong[i]).c_str() : "",
                  weak_row ? fmt::format("{:.2f}x", train_rates[i] / train_rates[1]).c_str() : "",
                  weak_row ? fmt::format("{:.2f}", weak[i]).c_str() : "");
    }
    std::printf("\n| all-reduce, 2 ranks | tensors | MiB | per tensor ms | bucketed (25 MiB) ms | flat ms | "
                "bucketed vs per tensor | flat GB/s |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& [name, sz] : cases) {
      const double bytes = results.at(name + "_bytes");
      std::printf("| %s | %zu | %.2f | %.2f | %.2f (%g buckets) | %.2f | %.2fx | %.2f |\n",
                  name == "cnn" ? "CNN gradients" : "256 x 64 KiB", sz.size(), bytes / (1 << 20),
                  results.at(name + "_per_tensor") * 1e3, results.at(name + "_bucketed") * 1e3,
                  results.at(name + "_buckets"), results.at(name + "_flat") * 1e3,
                  results.at(name + "_per_tensor") / results.at(name + "_bucketed"),
                  bytes / results.at(name + "_flat") / 1e9);
    }
    if (!json.empty()) {
      std::ofstream out(json);
      out << "{\n  \"batch_size\": " << batch_size << ",\n  \"steps\": " << steps << ",\n  \"train\": [";
      for (size_t i = 0; i < configs.size(); ++i) {
        out << (i ? ", " : "") << "{\"name\": \"" << configs[i].name << "\", \"ranks\": " << configs[i].nproc
            << ", \"global_batch\": " << configs[i].global_batch << ", \"samples_per_s\": " << train_rates[i]
            << ", \"strong_efficiency\": " << strong[i] << ", \"weak_efficiency\": " << weak[i] << "}";
      }
      out << "],\n  \"allreduce\": {";
      bool first = true;
      for (auto& [k, v] : results) {
        if (k == "samples_per_s") continue;
        out << (first ? "" : ", ") << "\"" << k << "\": " << v;
        first = false;
      }
      out << "}\n}\n";
    }
    std::filesystem::remove_all(tmp);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ddp: %s\n", e.what());
    return 1;
  }
  return 0;
}
