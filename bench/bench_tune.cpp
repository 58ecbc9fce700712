// bench_tune: trainkit's Bayesian search (GPSampler, log-EI) against random search (RandomSampler) on
// Branin (2-D) and Hartmann-6, the standard synthetic test functions, each method with the same seeds and
// evaluations: median simple regret (best value found − the global minimum) after every evaluation, and the
// time of one suggestion once the study holds `evals` observations. The Python peer
// (scripts/bench_tune_peer.py) runs Optuna's TPE and its random search on the same functions.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/stats.h"
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

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"bench_tune: Bayesian search (GP, log-EI) vs random search on Branin and Hartmann-6"};
  int seeds = 10;
  int evals = 50;
  std::string csv_path;
  std::vector<std::string> problems = {"branin", "hartmann6"};
  cli.option("--seeds", seeds, "Seeds per method and problem").show_default();
  cli.option("--evals", evals, "Evaluations per study").show_default();
  cli.option("--problems", problems, "branin, hartmann6").show_default();
  cli.option("--csv", csv_path, "Write the median best-so-far regret after every evaluation here");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  torch::set_num_threads(1);  // the GP's matrices are 50 x 50: threads only add overhead

  std::ofstream csv;
  if (!csv_path.empty()) {
    csv.open(csv_path);
    csv << "problem,method,evaluation,median_regret\n";
  }
  fmt::print("{:<10} {:<8} {:>22} {:>26} {:>14}\n", "problem", "method", "median regret @" + std::to_string(evals),
             "regret quartiles (25/75%)", "s/suggestion");
  for (const auto& name : problems) {
    const Problem prob = name == "branin" ? branin() : hartmann6();
    for (const std::string method : {"gp", "random"}) {
      std::vector<std::vector<double>> curves(static_cast<size_t>(evals));
      std::vector<double> final_regret, ask_seconds;
      for (int seed = 0; seed < seeds; ++seed) {
        std::shared_ptr<trainkit::tune::Sampler> sampler;
        if (method == "gp") {
          sampler = std::make_shared<trainkit::tune::GPSampler>();
        } else {
          sampler = std::make_shared<trainkit::tune::RandomSampler>();
        }
        trainkit::tune::Study study(prob.space, sampler, trainkit::tune::StudyOptions().seed(static_cast<uint64_t>(seed)));
        double best = INFINITY;
        for (int i = 0; i < evals; ++i) {
          const auto t = study.ask();
          const double y = prob.f(t.params);
          study.tell(t.number, y);
          best = std::min(best, y);
          curves[static_cast<size_t>(i)].push_back(best - prob.minimum);
        }
        final_regret.push_back(best - prob.minimum);
        const auto start = Clock::now();
        study.ask();  // the suggestion at `evals` observations
        ask_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
      std::vector<double> sorted = final_regret;
      std::sort(sorted.begin(), sorted.end());
      const double q1 = sorted[sorted.size() / 4];
      const double q3 = sorted[(3 * sorted.size()) / 4];
      fmt::print("{:<10} {:<8} {:>22.4g} {:>26} {:>14.3f}\n", prob.name, method, median(final_regret),
                 fmt::format("{:.3g} / {:.3g}", q1, q3), median(ask_seconds));
      std::fflush(stdout);
      if (csv.is_open()) {
        for (int i = 0; i < evals; ++i) {
          csv << fmt::format("{},{},{},{:.6g}\n", prob.name, method, i + 1, median(curves[static_cast<size_t>(i)]));
        }
      }
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
