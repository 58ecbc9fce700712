// TPE and the successive-halving / Hyperband pruners: the Parzen estimators' weights and densities, TPE's split,
// scores and winning candidate, the pruners' decisions over a schedule of reports and Hyperband's brackets equal
// Optuna's (golden, tests/golden/tpe.toml from scripts/golden_tpe.py); the sampler is reproducible, starts
// random, beats random search on a quadratic, and rejects bad options; a pruned trial keeps its last value.
#include <cmath>
#include <limits>

#include "support.h"
#include "trainkit/tune/hyperband.h"
#include "trainkit/tune/optuna_journal.h"
#include "trainkit/tune/study.h"
#include "trainkit/tune/tpe_sampler.h"

using namespace trainkit::tune;
using trainkit::test::WhatContains;

namespace {

using View = toml::node_view<const toml::node>;

std::vector<double> golden_numbers(const View& v) {
  std::vector<double> out;
  for (const auto& x : *v.as_array()) out.push_back(x.value<double>().value());
  return out;
}

std::vector<int64_t> golden_integers(const View& v) {
  std::vector<int64_t> out;
  for (const auto& x : *v.as_array()) out.push_back(x.value<int64_t>().value());
  return out;
}

std::vector<std::vector<double>> golden_rows(const View& v) {
  std::vector<std::vector<double>> out;
  for (const auto& r : *v.as_array()) out.push_back(golden_numbers(View{r}));
  return out;
}

SearchSpace space_of(const View& c) {
  SearchSpace space;
  for (const auto& node : *c["params"].as_array()) {
    const View p{node};
    const auto name = p["name"].value<std::string>().value();
    const auto kind = p["kind"].value<std::string>().value();
    if (kind == "categorical") {
      std::vector<std::string> choices;
      for (const auto& x : *p["choices"].as_array()) choices.push_back(x.value<std::string>().value());
      space.add_categorical(name, choices);
    } else if (kind == "int") {
      space.add_int(name, p["low"].value<int64_t>().value(), p["high"].value<int64_t>().value(),
                    p["log"].value<bool>().value());
    } else {
      space.add_float(name, p["low"].value<double>().value(), p["high"].value<double>().value(),
                      p["log"].value<bool>().value());
    }
  }
  return space;
}

ParamSet point_of(const SearchSpace& space, const std::vector<double>& internal) {
  ParamSet out;
  for (size_t i = 0; i < internal.size(); ++i) out[space.params()[i].name] = optuna_external(space.params()[i], internal[i]);
  return out;
}

bool near(double a, double b, double rel = 1e-9) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::abs(a - b) <= rel * std::max(1.0, std::abs(b));
}

double bowl(const ParamSet& p) {
  const double x = std::get<double>(p.at("x"));
  const double y = std::get<double>(p.at("y"));
  return (x - 0.3) * (x - 0.3) + 2 * (y + 0.2) * (y + 0.2);
}

}  // namespace

TEST_CASE("Parzen estimators' weights and densities equal Optuna's", "[tune][tpe][golden]") {
  const auto& g = trainkit::test::golden("tpe.toml");
  const auto& cases = *g["parzen"].as_array();
  REQUIRE(cases.size() == 8);
  for (const auto& node : cases) {
    const View c{node};
    INFO(c["name"].value<std::string>().value());
    const SearchSpace space = space_of(c);
    const auto options = ParzenEstimatorOptions()
                             .prior_weight(c["prior_weight"].value<double>().value())
                             .consider_magic_clip(c["consider_magic_clip"].value<bool>().value())
                             .consider_endpoints(c["consider_endpoints"].value<bool>().value());
    const ParzenEstimator pe(space.params(), golden_rows(c["observations"]), options);
    const auto weights = golden_numbers(c["weights"]);
    REQUIRE(pe.weights().size() == weights.size());
    for (size_t k = 0; k < weights.size(); ++k) CHECK(near(pe.weights()[k], weights[k], 1e-12));
    const auto points = golden_rows(c["points"]);
    const auto want = golden_numbers(c["log_pdf"]);
    for (size_t i = 0; i < points.size(); ++i) {
      INFO("point " << i);
      CHECK(near(pe.log_pdf(points[i]), want[i]));
    }
  }
}

TEST_CASE("TPE's split, log l, log g and winning candidate equal Optuna's", "[tune][tpe][golden]") {
  const auto& g = trainkit::test::golden("tpe.toml");
  const auto& cases = *g["tpe"].as_array();
  REQUIRE(cases.size() == 3);
  for (const auto& node : cases) {
    const View c{node};
    INFO(c["name"].value<std::string>().value());
    const SearchSpace space = space_of(c);
    const double sign = c["direction"].value<std::string>().value() == "minimize" ? 1.0 : -1.0;
    // Observations in trial order as tune::Study hands them over; the running trials (numbered last) pending.
    std::vector<Observation> observed;
    std::vector<std::vector<double>> pending;
    std::vector<int64_t> number_of;
    int64_t number = 0;
    for (const auto& tn : *c["trials"].as_array()) {
      const View t{tn};
      const auto kind = t["kind"].value<std::string>().value();
      auto u = space.encode(point_of(space, golden_numbers(t["internal"])));
      if (kind == "running") {
        pending.push_back(u);
      } else {
        Observation o{u, kind == "complete" ? sign * t["value"].value<double>().value() : NAN};
        if (kind == "pruned") {
          o.pruned = true;
          if (t["steps"]) {
            o.last_step = golden_integers(t["steps"]).back();
            o.last_value = sign * golden_numbers(t["reports"]).back();
          }
        }
        observed.push_back(o);
        number_of.push_back(number);
      }
      ++number;
    }
    const auto candidates = golden_rows(c["candidates"]);
    const TPEScores scores = tpe_scores(space, observed, pending, candidates);
    std::vector<int64_t> below;
    for (size_t i : scores.split.below) below.push_back(number_of[i]);
    CHECK(below == golden_integers(c["below"]));
    const auto log_l = golden_numbers(c["log_l"]), log_g = golden_numbers(c["log_g"]);
    for (size_t i = 0; i < candidates.size(); ++i) {
      INFO("candidate " << i);
      CHECK(near(scores.log_l[i], log_l[i], 1e-8));
      CHECK(near(scores.log_g[i], log_g[i], 1e-8));
    }
    CHECK(scores.best == static_cast<size_t>(c["best"].value<int64_t>().value()));
  }
}

TEST_CASE("gamma and weights are Optuna's default_gamma and default_weights", "[tune][tpe]") {
  CHECK(tpe_gamma(0) == 0);
  CHECK(tpe_gamma(1) == 1);
  CHECK(tpe_gamma(10) == 1);
  CHECK(tpe_gamma(30) == 3);
  CHECK(tpe_gamma(31) == 4);
  CHECK(tpe_gamma(1000) == 25);
  CHECK(tpe_weights(3) == std::vector<double>{1, 1, 1});
  const auto w = tpe_weights(30);
  REQUIRE(w.size() == 30);
  CHECK(w[0] == Approx(1.0 / 30));
  CHECK(w[4] == 1.0);
  CHECK(w[2] == Approx(1.0 / 30 + 2 * (1 - 1.0 / 30) / 4));
}

TEST_CASE("successive-halving and Hyperband decisions equal Optuna's", "[tune][tpe][pruner][golden]") {
  const auto& g = trainkit::test::golden("tpe.toml");
  const auto& cases = *g["pruner"].as_array();
  REQUIRE(cases.size() == 5);
  for (const auto& node : cases) {
    const View c{node};
    INFO(c["name"].value<std::string>().value());
    std::shared_ptr<Pruner> pruner;
    if (c["kind"].value<std::string>().value() == "sh") {
      auto o = SuccessiveHalvingPrunerOptions().min_resource(c["min_resource"].value<int64_t>().value());
      if (c["reduction_factor"]) o.reduction_factor(c["reduction_factor"].value<int64_t>().value());
      if (c["min_early_stopping_rate"]) o.min_early_stopping_rate(c["min_early_stopping_rate"].value<int64_t>().value());
      if (c["bootstrap_count"]) o.bootstrap_count(c["bootstrap_count"].value<int64_t>().value());
      pruner = std::make_shared<SuccessiveHalvingPruner>(o);
    } else {
      pruner = std::make_shared<HyperbandPruner>(HyperbandPrunerOptions()
                                                     .min_resource(c["min_resource"].value<int64_t>().value())
                                                     .max_resource(c["max_resource"].value<int64_t>().value())
                                                     .reduction_factor(c["reduction_factor"].value<int64_t>().value())
                                                     .study_name(c["study_name"].value<std::string>().value()));
    }
    Study study(SearchSpace().add_float("x", 0, 1), std::make_shared<RandomSampler>(),
                StudyOptions().direction(c["direction"].value<std::string>().value()), pruner);
    const auto trial = golden_integers(c["trial"]), step = golden_integers(c["step"]), want = golden_integers(c["pruned"]);
    const auto value = golden_numbers(c["value"]);
    std::map<int64_t, int64_t> number, last;
    for (size_t e = 0; e < trial.size(); ++e) last[trial[e]] = step[e];
    int64_t mismatches = 0;
    for (size_t e = 0; e < trial.size(); ++e) {
      if (!number.count(trial[e])) number[trial[e]] = study.ask().number;
      const int64_t n = number[trial[e]];
      if (study.trials()[static_cast<size_t>(n)].state != TrialState::Running) {
        CHECK(want[e] == -1);
        continue;
      }
      const bool prune = study.report(n, step[e], value[e]);
      if (prune != (want[e] == 1)) {
        ++mismatches;
        UNSCOPED_INFO("event " << e << ": trial " << trial[e] << " step " << step[e] << ": pruned " << prune);
      }
      if (prune) study.prune(n);
      else if (step[e] == last[trial[e]]) study.tell(n, value[e]);
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("crc32 and Hyperband's brackets equal Optuna's", "[tune][tpe][pruner][golden]") {
  const auto& g = trainkit::test::golden("tpe.toml");
  for (const auto& node : *g["crc32"].as_array()) {
    const View c{node};
    CHECK(crc32(c["text"].value<std::string>().value()) == c["crc"].value<int64_t>().value());
  }
  const auto& cases = *g["bracket"].as_array();
  REQUIRE(cases.size() == 4);
  for (const auto& node : cases) {
    const View c{node};
    const int64_t max_resource = c["max_resource"].value<int64_t>().value();
    const HyperbandPruner hb(HyperbandPrunerOptions()
                                 .min_resource(c["min_resource"].value<int64_t>().value())
                                 .max_resource(max_resource)
                                 .reduction_factor(c["reduction_factor"].value<int64_t>().value())
                                 .study_name(c["study_name"].value<std::string>().value()));
    INFO(hb.options().study_name());
    CHECK(hb.n_brackets(max_resource) == c["n_brackets"].value<int64_t>().value());
    const auto want = golden_integers(c["brackets"]);
    for (size_t i = 0; i < want.size(); ++i) CHECK(hb.bracket(static_cast<int64_t>(i), max_resource) == want[i]);
  }
}

TEST_CASE("successive halving's min_resource auto waits for a completed trial", "[tune][tpe][pruner]") {
  const SuccessiveHalvingPruner sh;  // min_resource auto, eta 4
  Study study(SearchSpace().add_float("x", 0, 1), std::make_shared<RandomSampler>(), {},
              std::make_shared<SuccessiveHalvingPruner>());
  // Nothing completed: never pruned, however bad.
  const auto a = study.ask();
  for (int64_t s = 0; s < 300; ++s) CHECK_FALSE(study.report(a.number, s, 1.0));
  study.tell(a.number, 1.0);
  // min_resource = 299 / 100 = 2: a worse trial is pruned at its first rung (step 2), not before.
  const auto b = study.ask();
  CHECK_FALSE(study.report(b.number, 0, 5.0));
  CHECK_FALSE(study.report(b.number, 1, 5.0));
  CHECK(study.report(b.number, 2, 5.0));
  CHECK(sh.options().reduction_factor() == 4);
}

TEST_CASE("pruners reject bad options naming them", "[tune][tpe][pruner]") {
  CHECK_THROWS_MATCHES(SuccessiveHalvingPruner(SuccessiveHalvingPrunerOptions().reduction_factor(1)), std::invalid_argument,
                       WhatContains("reduction_factor must be >= 2, got 1"));
  CHECK_THROWS_MATCHES(SuccessiveHalvingPruner(SuccessiveHalvingPrunerOptions().min_resource(0)), std::invalid_argument,
                       WhatContains("min_resource must be >= 1 or auto, got 0"));
  CHECK_THROWS_MATCHES(SuccessiveHalvingPruner(SuccessiveHalvingPrunerOptions().bootstrap_count(2)), std::invalid_argument,
                       WhatContains("bootstrap_count 2 needs a min_resource"));
  CHECK_THROWS_MATCHES(SuccessiveHalvingPruner(SuccessiveHalvingPrunerOptions().min_early_stopping_rate(-1)), std::invalid_argument,
                       WhatContains("min_early_stopping_rate must be >= 0"));
  CHECK_THROWS_MATCHES(HyperbandPruner(HyperbandPrunerOptions().min_resource(5).max_resource(3)), std::invalid_argument,
                       WhatContains("max_resource must be >= min_resource (5) or auto, got 3"));
  CHECK_THROWS_MATCHES(HyperbandPruner(HyperbandPrunerOptions().bootstrap_count(1)), std::invalid_argument,
                       WhatContains("bootstrap_count 1 needs a max_resource"));
  CHECK_THROWS_MATCHES(TPESampler(TPESamplerOptions().n_ei_candidates(0)), std::invalid_argument,
                       WhatContains("n_ei_candidates must be >= 1, got 0"));
  CHECK_THROWS_MATCHES(TPESampler(TPESamplerOptions().n_startup_trials(-1)), std::invalid_argument,
                       WhatContains("n_startup_trials must be >= 0, got -1"));
  CHECK_THROWS_MATCHES(TPESampler(TPESamplerOptions().parzen(ParzenEstimatorOptions().prior_weight(-1))), std::invalid_argument,
                       WhatContains("prior_weight must be >= 0, got -1"));
}

TEST_CASE("TPE starts with RandomSampler's points, is reproducible and beats random search", "[tune][tpe]") {
  const SearchSpace space = SearchSpace().add_float("x", -1, 1).add_float("y", -1, 1);
  const auto run = [&](std::shared_ptr<Sampler> sampler, uint64_t seed) {
    Study study(space, sampler, StudyOptions().seed(seed));
    for (int i = 0; i < 60; ++i) {
      const auto t = study.ask();
      study.tell(t.number, bowl(t.params));
    }
    return study;
  };
  const Study a = run(std::make_shared<TPESampler>(), 3);
  const Study b = run(std::make_shared<TPESampler>(), 3);
  const Study r = run(std::make_shared<RandomSampler>(), 3);
  for (size_t i = 0; i < a.trials().size(); ++i) CHECK((a.trials()[i].params == b.trials()[i].params));
  for (size_t i = 0; i < 10; ++i) CHECK((a.trials()[i].params == r.trials()[i].params));  // n_startup_trials 10
  // Over several seeds, TPE's best after 60 trials is better than random search's on most.
  int wins = 0;
  for (uint64_t seed = 0; seed < 5; ++seed) {
    wins += run(std::make_shared<TPESampler>(), seed).best_trial()->value <
            run(std::make_shared<RandomSampler>(), seed).best_trial()->value;
  }
  CHECK(wins >= 4);
}

TEST_CASE("TPE proposes in mixed spaces, independent and batched, within the space", "[tune][tpe]") {
  const SearchSpace space = SearchSpace()
                                .add_float("lr", 1e-4, 1e-1, true)
                                .add_int("width", 4, 64)
                                .add_int("units", 1, 100, true)
                                .add_categorical("act", {"relu", "tanh", "gelu"})
                                .add_categorical("only", {"one"});
  for (const bool multivariate : {true, false}) {
    INFO("multivariate " << multivariate);
    Study study(space, std::make_shared<TPESampler>(TPESamplerOptions().multivariate(multivariate)),
                StudyOptions().seed(1));
    for (int i = 0; i < 8; ++i) {
      for (const auto& t : study.ask(3)) {
        const double lr = std::get<double>(t.params.at("lr"));
        const auto width = std::get<int64_t>(t.params.at("width"));
        CHECK(lr >= 1e-4);
        CHECK(lr <= 1e-1);
        CHECK(width >= 4);
        CHECK(width <= 64);
        CHECK(std::get<std::string>(t.params.at("only")) == "one");
        const double value = std::log10(lr) + 2.5 + (width - 20) * 0.01 +
                             (std::get<std::string>(t.params.at("act")) == "tanh" ? 0 : 1);
        if (t.number % 5 == 4) {
          study.report(t.number, 0, value);
          study.prune(t.number);
        } else {
          study.tell(t.number, value * value);
        }
      }
    }
    CHECK(study.trials().size() == 24);
  }
}

TEST_CASE("a pruned trial's value is its last reported value", "[tune][tpe][pruner]") {
  Study study(SearchSpace().add_float("x", 0, 1), std::make_shared<RandomSampler>());
  const auto a = study.ask();
  study.report(a.number, 0, 0.7);
  study.report(a.number, 3, 0.4);
  study.prune(a.number);
  CHECK(study.trials()[0].state == TrialState::Pruned);
  CHECK(study.trials()[0].value == 0.4);
  const auto b = study.ask();
  study.report(b.number, 0, NAN);
  study.prune(b.number);
  CHECK(std::isnan(study.trials()[1].value));
  CHECK(pruned_values({{0, 1.0}, {2, 2.5}}) == std::vector<double>{2.5});
  CHECK(pruned_values({{0, 1.0}, {2, INFINITY}}).empty());
  CHECK(pruned_values({}).empty());
}
