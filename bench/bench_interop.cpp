// bench_interop: loading a large checkpoint, trainkit against Python. Writes one set of tensors (float32,
// `--mb` MiB in all, a few large matrices and many small vectors, as in a state_dict) as a safetensors file
// and as a torch.save state_dict, then loads each file in a fresh process, rounds interleaved:
//   trainkit: io::load_safetensors (memory-mapped) and io::load_pt;
//   Python (scripts/bench_interop_peer.py, the same wheel): safetensors.torch.load_file and
//   torch.load(weights_only=True).
// Each child reports the load time, the time of one pass over every element afterwards (a sum: it makes a
// lazy, memory-mapped load pay for its page faults) and its resident memory before the load and at its
// peak (VmRSS, VmHWM). The files are in the page cache (just written and read once), so the table measures
// the loaders, not the disk.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/stats.h"
#include "trainkit/io/safetensors.h"
#include "trainkit/io/torch_save.h"
#include "trainkit/subprocess.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A field of /proc/self/status in MiB (VmRSS, VmHWM).
double status_mib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::stod(line.substr(field.size() + 1)) / 1024.0;  // the kernel writes kB
    }
  }
  throw std::runtime_error("/proc/self/status has no " + field);
}

// The child: loads `file` with `kind`, prints "load_s sum_s rss_before_mib hwm_mib checksum".
int run_child(const std::string& kind, const std::string& file) {
  // LibTorch's one-time set-up (Python's `import torch` does it before the peer's clock starts).
  (void)torch::ones({8}).sum().item<float>();
  const double rss_before = status_mib("VmRSS");
  const auto start = Clock::now();
  trainkit::io::TensorDict tensors =
      kind == "safetensors" ? trainkit::io::load_safetensors(file).tensors : trainkit::io::load_pt(file);
  const double load_s = seconds_since(start);
  const auto sum_start = Clock::now();
  double checksum = 0;
  for (const auto& item : tensors) {
    checksum += item.value().sum().item<double>();
  }
  const double sum_s = seconds_since(sum_start);
  fmt::print("{:.6f} {:.6f} {:.1f} {:.1f} {:.6g}\n", load_s, sum_s, rss_before, status_mib("VmHWM"), checksum);
  return 0;
}

struct Sample {
  double load_s, sum_s, rss_before, hwm;
};

Sample run_one(const std::vector<std::string>& argv, const fs::path& log) {
  trainkit::Subprocess child(trainkit::SubprocessOptions().argv(argv).log_file(log.string()));
  const auto status = child.wait();
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  if (!status.ok()) {
    throw std::runtime_error(fmt::format("{} {}: {}", argv.front(), status.to_string(), text.str()));
  }
  // The last line holds the numbers (Python may warn before it).
  std::string line, last;
  while (std::getline(text, line)) {
    if (!line.empty()) last = line;
  }
  Sample s{};
  std::istringstream fields(last);
  if (!(fields >> s.load_s >> s.sum_s >> s.rss_before >> s.hwm)) {
    throw std::runtime_error(fmt::format("{} printed no numbers: {}", argv.front(), text.str()));
  }
  return s;
}

using trainkit::app::median;

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "bench_interop: load a large safetensors file and a torch.save state_dict, trainkit vs Python"};
  int64_t mib = 1024;
  int rounds = 5;
  std::string dir = (fs::temp_directory_path() / "trainkit_bench_interop").string();
  std::string python = std::string(TRAINKIT_SOURCE_DIR) + "/.venv/bin/python";
  std::string child_kind, child_file;
  cli.option("--mb", mib, "MiB of float32 tensors in each file").show_default().positive();
  cli.option("--rounds", rounds, "Loads per loader (each in a fresh process), interleaved").show_default().positive();
  cli.option("--dir", dir, "Where the two files are written (removed at the end)").show_default();
  cli.option("--python", python, "Python with the pinned torch and safetensors (the peer)").show_default();
  cli.option("--child", child_kind, "(internal) load one file in this process: safetensors or pt");
  cli.option("--file", child_file, "(internal) the file --child loads");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  if (!child_kind.empty()) {
    return run_child(child_kind, child_file);
  }

  // A state_dict-like set: blocks of one 16 MiB matrix and 64 vectors of 4 KiB (1.5% of the bytes).
  fs::create_directories(dir);
  const fs::path st_file = fs::path(dir) / "big.safetensors";
  const fs::path pt_file = fs::path(dir) / "big.pt";
  {
    torch::manual_seed(0);
    trainkit::io::TensorDict tensors;
    const int64_t blocks = std::max<int64_t>(1, mib * 4 / 65);  // 16.25 MiB each
    for (int64_t i = 0; i < blocks; ++i) {
      tensors.insert(fmt::format("layers.{}.weight", i), torch::randn({2048, 2048}));
      for (int64_t j = 0; j < 64; ++j) {
        tensors.insert(fmt::format("layers.{}.norm{}.weight", i, j), torch::randn({1024}));
      }
    }
    trainkit::io::save_safetensors(st_file.string(), tensors);
    trainkit::io::save_pt(pt_file.string(), tensors);
    fmt::print("{} tensors; {}: {:.0f} MiB, {}: {:.0f} MiB\n", tensors.size(), st_file.filename().string(),
               fs::file_size(st_file) / 1048576.0, pt_file.filename().string(), fs::file_size(pt_file) / 1048576.0);
  }
  const std::string self = fs::canonical("/proc/self/exe").string();
  const std::string peer = std::string(TRAINKIT_SOURCE_DIR) + "/scripts/bench_interop_peer.py";
  struct Loader {
    std::string name;
    std::vector<std::string> argv;
  };
  const std::vector<Loader> loaders = {
      {"trainkit io::load_safetensors (mmap)", {self, "--child", "safetensors", "--file", st_file.string()}},
      {"Python safetensors.torch.load_file", {python, peer, "safetensors", st_file.string()}},
      {"trainkit io::load_pt", {self, "--child", "pt", "--file", pt_file.string()}},
      {"Python torch.load(weights_only=True)", {python, peer, "pt", pt_file.string()}},
  };
  const fs::path log = fs::path(dir) / "child.log";
  std::map<std::string, std::vector<Sample>> samples;
  for (const auto& l : loaders) run_one(l.argv, log);  // warm the page cache and the programs
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < loaders.size(); ++i) {
      const auto& l = loaders[(i + static_cast<size_t>(r)) % loaders.size()];  // rotate the order
      samples[l.name].push_back(run_one(l.argv, log));
    }
  }
  fmt::print("{:<38} {:>8} {:>12} {:>14} {:>14}\n", "loader (median of " + std::to_string(rounds) + ")", "load s",
             "load+sum s", "RSS before MiB", "peak RSS MiB");
  for (const auto& l : loaders) {
    std::vector<double> load, total, before, peak;
    for (const auto& s : samples[l.name]) {
      load.push_back(s.load_s);
      total.push_back(s.load_s + s.sum_s);
      before.push_back(s.rss_before);
      peak.push_back(s.hwm);
    }
    fmt::print("{:<38} {:>8.3f} {:>12.3f} {:>14.0f} {:>14.0f}\n", l.name, median(load), median(total), median(before),
               median(peak));
  }
  fs::remove_all(dir);
  return 0;
}
