// bench_tune: trainkit's Bayesian search (GPSampler, log-EI) against Optuna's GPSampler (the same design:
// Matérn-5/2 ARD kernel, log-EI) and random search (RandomSampler) on Branin (2-D) and Hartmann-6, the
// standard synthetic test functions, each method with the same seeds and evaluations: median simple regret
// (best value found − the global minimum) after every evaluation, and the time of one suggestion once the
// study holds `evals` observations. Optuna's GPSampler runs in a Python peer process
// (scripts/bench_tune_peer.py --serve), one study per seed right after trainkit's study of the same seed, so
// that both see the same machine load; the peer run alone also gives Optuna's TPE and random search.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/stats.h"
#include "trainkit/subprocess.h"
#include "trainkit/tune/sampler.h"
#include "trainkit/tune/study.h"
#include "trainkit/tune/tpe_sampler.h"

namespace {

using trainkit::tune::ParamSet;
using trainkit::tune::SearchSpace;
using Clock = std::chrono::steady_clock;

struct Problem {
  std::string name;
  SearchSpace space;
  std::function<double(const ParamSet&)> f;
  double minimum;
};

double at(const ParamSet& p, const std::string& k) { return std::get<double>(p.at(k)); }

Problem branin() {
  // Branin–Hoo on [-5, 10] x [0, 15]; global minimum 0.397887 (three minimizers).
  return {"branin", SearchSpace().add_float("x1", -5, 10).add_float("x2", 0, 15),
          [](const ParamSet& p) {
            const double x1 = at(p, "x1"), x2 = at(p, "x2");
            const double b = 5.1 / (4 * M_PI * M_PI), c = 5 / M_PI, t = 1 / (8 * M_PI);
            return std::pow(x2 - b * x1 * x1 + c * x1 - 6, 2) + 10 * (1 - t) * std::cos(x1) + 10;
          },
          0.39788735772973816};
}

Problem hartmann6() {
  // Hartmann-6 on [0, 1]^6; global minimum −3.32237.
  static const double alpha[4] = {1.0, 1.2, 3.0, 3.2};
  static const double A[4][6] = {{10, 3, 17, 3.5, 1.7, 8}, {0.05, 10, 17, 0.1, 8, 14},
                                 {3, 3.5, 1.7, 10, 17, 8}, {17, 8, 0.05, 10, 0.1, 14}};
  static const double P[4][6] = {{1312, 1696, 5569, 124, 8283, 5886}, {2329, 4135, 8307, 3736, 1004, 9991},
                                 {2348, 1451, 3522, 2883, 3047, 6650}, {4047, 8828, 8732, 5743, 1091, 381}};
  SearchSpace s;
  for (int i = 0; i < 6; ++i) s.add_float(fmt::format("x{}", i), 0, 1);
  return {"hartmann6", s,
          [](const ParamSet& p) {
            double y = 0;
            for (int i = 0; i < 4; ++i) {
              double e = 0;
              for (int j = 0; j < 6; ++j) {
                const double d = at(p, fmt::format("x{}", j)) - 1e-4 * P[i][j];
                e += A[i][j] * d * d;
              }
              y -= alpha[i] * std::exp(-e);
            }
            return y;
          },
          -3.3223680114155147};
}

using trainkit::app::median;

/// Where one GP suggestion's time goes, timed through the public API on a study's first `evals` observations
/// as GPSampler::suggest does them (seconds): the hyperparameter fit (set_data + fit), one factorization
/// (kernel + Cholesky, as each fit evaluation does before its gradient), scoring the acquisition's raw samples,
/// and the acquisition's ascent.
struct GpProfile {
  double fit = 0, factorization = 0, scoring = 0, ascent = 0;
};

GpProfile profile_gp(const trainkit::tune::Study& study, int evals, uint64_t seed) {
  namespace tt = trainkit::tune;
  const auto& space = study.space();
  std::vector<double> xs, ys;
  std::vector<std::pair<double, size_t>> ranked;
  for (int i = 0; i < evals; ++i) {
    const auto& t = study.trials()[static_cast<size_t>(i)];
    const auto u = space.encode(t.params);
    xs.insert(xs.end(), u.begin(), u.end());
    ys.push_back(t.value);
    ranked.emplace_back(t.value, static_cast<size_t>(i));
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::vector<double>> anchors;
  for (size_t i = 0; i < std::min<size_t>(5, ranked.size()); ++i) {
    anchors.push_back(space.encode(study.trials()[ranked[i].second].params));
  }
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  const tt::GPSamplerOptions defaults;
  GpProfile p;
  auto start = Clock::now();
  auto lap = [&] {
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - start).count();
    start = now;
    return s;
  };
  tt::GaussianProcess gp(defaults.gp());
  std::mt19937_64 rng(tt::mix_seed(seed, static_cast<uint64_t>(evals)));
  gp.set_data(torch::tensor(xs, opts).view({evals, space.dims()}), torch::tensor(ys, opts));
  gp.fit(rng);
  p.fit = lap();
  gp.set_hyperparameters(gp.hyperparameters());
  p.factorization = lap();
  const double best = (ranked.front().first - gp.y_mean()) / gp.y_std();
  std::mt19937_64 rng_scoring = rng;
  tt::maximize_acquisition(gp, best, tt::AcquisitionOptions(defaults.acquisition()).steps(0), anchors, rng_scoring);
  p.scoring = lap();
  tt::maximize_acquisition(gp, best, defaults.acquisition(), anchors, rng);
  p.ascent = std::max(0.0, lap() - p.scoring);
  return p;
}

/// One method's studies: best-so-far regret after every evaluation (per evaluation, one value per seed), the
/// final regret and the time of the suggestion at `evals` observations per seed.
struct Runs {
  std::vector<std::vector<double>> curves;
  std::vector<double> final_regret, ask_seconds;
  explicit Runs(int evals) : curves(static_cast<size_t>(evals)) {}
  void add(const std::vector<double>& curve, double seconds) {
    for (size_t i = 0; i < curves.size(); ++i) curves[i].push_back(curve[i]);
    final_regret.push_back(curve.back());
    ask_seconds.push_back(seconds);
  }
};

/// Optuna's GPSampler in the Python peer (scripts/bench_tune_peer.py --serve): run() asks it for one study.
class OptunaGpPeer {
 public:
  explicit OptunaGpPeer(const std::string& python) : command_(python + " " + script()) {
    child_ = trainkit::Subprocess(
        trainkit::SubprocessOptions().argv({python, script(), "--serve"}).pipe_input(true).pipe_output(true));
    in_ = fdopen(child_.take_stdin(), "w");
    out_ = fdopen(child_.take_stdout(), "r");
    err_fd_ = child_.take_stderr();
    const std::string ready = read_line();
    if (ready.rfind("ready ", 0) != 0) fail("ended before it was ready", ready);
    description_ = ready.substr(6);
  }
  OptunaGpPeer(const OptunaGpPeer&) = delete;
  OptunaGpPeer& operator=(const OptunaGpPeer&) = delete;
  ~OptunaGpPeer() {
    if (in_ != nullptr) std::fclose(in_);  // end of file: the peer exits
    if (out_ != nullptr) std::fclose(out_);
    if (err_fd_ >= 0) ::close(err_fd_);
    child_.wait();
  }
  /// "optuna 5.1.0 greenlet no": the peer's Optuna and whether it batches the acquisition's L-BFGS-B starts.
  const std::string& description() const { return description_; }
  /// One GPSampler study of `problem` with `seed`: the best-so-far regret after each of `evals` evaluations, and
  /// the seconds of the suggestion after them.
  std::pair<std::vector<double>, double> run(const std::string& problem, int seed, int evals) {
    std::fputs(fmt::format("gp {} {} {}\n", problem, seed, evals).c_str(), in_);
    std::fflush(in_);
    const std::string line = read_line();
    std::istringstream fields(line);
    double regret = 0, seconds = 0;
    std::string curve_text;
    fields >> regret >> seconds >> curve_text;
    std::vector<double> curve;
    std::istringstream values(curve_text);
    for (std::string v; std::getline(values, v, ',');) curve.push_back(std::stod(v));
    if (!fields || static_cast<int>(curve.size()) != evals) fail("gave a malformed answer to a study", line);
    return {curve, seconds};
  }

 private:
  static std::string script() { return std::string(TRAINKIT_SOURCE_DIR) + "/scripts/bench_tune_peer.py"; }
  [[noreturn]] void fail(const std::string& what, const std::string& line) {
    std::string err;
    char buffer[4096];
    for (ssize_t n; (n = ::read(err_fd_, buffer, sizeof buffer)) > 0;) err.append(buffer, static_cast<size_t>(n));
    throw std::runtime_error(fmt::format("{}: the Optuna peer {} ('{}'); its stderr:\n{}", command_, what, line, err));
  }
  std::string read_line() {
    std::string line;
    for (int ch; (ch = std::fgetc(out_)) != EOF && ch != '\n';) line.push_back(static_cast<char>(ch));
    return line;
  }
  std::string command_;
  trainkit::Subprocess child_;
  std::FILE* in_ = nullptr;
  std::FILE* out_ = nullptr;
  int err_fd_ = -1;
  std::string description_;
};

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"bench_tune: Bayesian search (GP, log-EI) vs random search on Branin and Hartmann-6"};
  int seeds = 10;
  int evals = 50;
  std::string csv_path;
  bool profile = false;
  bool no_python = false;
  std::string python = std::string(TRAINKIT_SOURCE_DIR) + "/.venv/bin/python";
  std::vector<std::string> problems = {"branin", "hartmann6"};
  cli.option("--seeds", seeds, "Seeds per method and problem").show_default();
  cli.option("--evals", evals, "Evaluations per study").show_default();
  cli.option("--problems", problems, "branin, hartmann6").show_default();
  cli.option("--csv", csv_path, "Write the median best-so-far regret after every evaluation here");
  cli.flag("--profile", profile, "After each problem's GP rows, where one suggestion's time goes (median over seeds)");
  cli.option("--python", python, "Python with Optuna (the peer that runs Optuna's GPSampler)").show_default();
  cli.flag("--no-python", no_python, "Skip Optuna's GPSampler");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  torch::set_num_threads(1);  // the GP's matrices are 50 x 50: threads only add overhead

  std::ofstream csv;
  if (!csv_path.empty()) {
    csv.open(csv_path);
    csv << "problem,method,evaluation,median_regret\n";
  }
  std::unique_ptr<OptunaGpPeer> peer;
  if (!no_python) {
    peer = std::make_unique<OptunaGpPeer>(python);
    fmt::print("optuna-gp: Optuna's GPSampler in {} ({}), each seed's study right after trainkit's\n", python,
               peer->description());
  }
  fmt::print("{:<10} {:<10} {:>22} {:>26} {:>14}\n", "problem", "method", "median regret @" + std::to_string(evals),
             "regret quartiles (25/75%)", "s/suggestion");
  for (const auto& name : problems) {
    const Problem prob = name == "branin" ? branin() : hartmann6();
    auto report = [&](const std::string& method, const Runs& runs) {
      std::vector<double> sorted = runs.final_regret;
      std::sort(sorted.begin(), sorted.end());
      const double q1 = sorted[sorted.size() / 4];
      const double q3 = sorted[(3 * sorted.size()) / 4];
      fmt::print("{:<10} {:<10} {:>22.4g} {:>26} {:>14.3f}\n", prob.name, method, median(runs.final_regret),
                 fmt::format("{:.3g} / {:.3g}", q1, q3), median(runs.ask_seconds));
      if (csv.is_open()) {
        for (int i = 0; i < evals; ++i) {
          csv << fmt::format("{},{},{},{:.6g}\n", prob.name, method, i + 1, median(runs.curves[static_cast<size_t>(i)]));
        }
      }
    };
    for (const std::string method : {"gp", "random"}) {
      Runs runs(evals), optuna(evals);
      std::vector<GpProfile> profiles;
      for (int seed = 0; seed < seeds; ++seed) {
        std::shared_ptr<trainkit::tune::Sampler> sampler;
        if (method == "gp") {
          sampler = std::make_shared<trainkit::tune::GPSampler>();
        } else {
          sampler = std::make_shared<trainkit::tune::RandomSampler>();
        }
        trainkit::tune::Study study(prob.space, sampler, trainkit::tune::StudyOptions().seed(static_cast<uint64_t>(seed)));
        std::vector<double> curve;
        double best = INFINITY;
        for (int i = 0; i < evals; ++i) {
          const auto t = study.ask();
          const double y = prob.f(t.params);
          study.tell(t.number, y);
          best = std::min(best, y);
          curve.push_back(best - prob.minimum);
        }
        const auto start = Clock::now();
        study.ask();  // the suggestion at `evals` observations
        runs.add(curve, std::chrono::duration<double>(Clock::now() - start).count());
        if (profile && method == "gp") profiles.push_back(profile_gp(study, evals, static_cast<uint64_t>(seed)));
        if (peer && method == "gp") {
          const auto [optuna_curve, seconds] = peer->run(prob.name, seed, evals);
          optuna.add(optuna_curve, seconds);
        }
      }
      report(method, runs);
      if (!optuna.final_regret.empty()) report("optuna-gp", optuna);
      if (!profiles.empty()) {
        auto med = [&](double GpProfile::*field) {
          std::vector<double> v;
          for (const auto& p : profiles) v.push_back(p.*field);
          return median(v);
        };
        const double fit = med(&GpProfile::fit), scoring = med(&GpProfile::scoring), ascent = med(&GpProfile::ascent);
        const double total = fit + scoring + ascent;
        fmt::print("  profile @{} obs: fit {:.4f} s ({:.0f}%; one factorization {:.3f} ms), acquisition scoring {:.4f} s "
                   "({:.0f}%), ascent {:.4f} s ({:.0f}%)\n",
                   evals, fit, 100 * fit / total, 1e3 * med(&GpProfile::factorization), scoring, 100 * scoring / total,
                   ascent, 100 * ascent / total);
      }
      std::fflush(stdout);
    }
  }
  // ---- trainkit's TPE (TPESampler, Optuna's defaults) beside Optuna's TPE (scripts/bench_tune_peer.py): median
  // regret and the time of one suggestion when the study holds `evals` and 4 x `evals` observations (50 and 200).
  {
    const std::vector<int> marks = {evals, 4 * evals};
    fmt::print("\n{:<10} {:<8} {:>12} {:>22} {:>26} {:>14}\n", "problem", "method", "observations", "median regret",
               "regret quartiles (25/75%)", "s/suggestion");
    for (const auto& name : problems) {
      const Problem prob = name == "branin" ? branin() : hartmann6();
      std::vector<std::vector<double>> regret(marks.size()), seconds(marks.size());
      std::vector<std::vector<double>> curves(static_cast<size_t>(marks.back()));
      for (int seed = 0; seed < seeds; ++seed) {
        trainkit::tune::Study study(prob.space, std::make_shared<trainkit::tune::TPESampler>(),
                                    trainkit::tune::StudyOptions().seed(static_cast<uint64_t>(seed)));
        double best = INFINITY;
        for (int i = 0; i <= marks.back(); ++i) {
          const auto start = Clock::now();
          const auto t = study.ask();
          const double s = std::chrono::duration<double>(Clock::now() - start).count();
          for (size_t m = 0; m < marks.size(); ++m) {
            if (i != marks[m]) continue;
            seconds[m].push_back(s);
            regret[m].push_back(best - prob.minimum);
          }
          if (i == marks.back()) break;
          const double y = prob.f(t.params);
          study.tell(t.number, y);
          best = std::min(best, y);
          curves[static_cast<size_t>(i)].push_back(best - prob.minimum);
        }
      }
      for (size_t m = 0; m < marks.size(); ++m) {
        std::vector<double> sorted = regret[m];
        std::sort(sorted.begin(), sorted.end());
        fmt::print("{:<10} {:<8} {:>12} {:>22.4g} {:>26} {:>14.4f}\n", prob.name, "tpe", marks[m], median(regret[m]),
                   fmt::format("{:.3g} / {:.3g}", sorted[sorted.size() / 4], sorted[(3 * sorted.size()) / 4]),
                   median(seconds[m]));
      }
      std::fflush(stdout);
      if (csv.is_open()) {
        for (int i = 0; i < marks.back(); ++i) {
          csv << fmt::format("{},tpe,{},{:.6g}\n", prob.name, i + 1, median(curves[static_cast<size_t>(i)]));
        }
      }
    }
  }
  return 0;
}
