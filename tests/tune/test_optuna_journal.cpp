// Optuna's journal file in the library: the replay against a journal Python Optuna wrote (golden), bad input (a
// damaged line, a malformed field, a torn last line), the lock (a stale one broken, a held one waited for), and a
// tune::Study kept in a journal: reopened, continued, refused on another space or direction, and read and extended
// by Python Optuna.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "support.h"
#include "trainkit/tune/optuna_journal.h"
#include "trainkit/tune/study.h"
#include "tune/journal_support.h"

namespace fs = std::filesystem;
namespace tune = trainkit::tune;
using trainkit::test::copy_golden;
using trainkit::test::golden_space;
using trainkit::test::LogCapture;

TEST_CASE("a journal Python Optuna wrote replays as Optuna replays it", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-golden");
  const std::string path = copy_golden(tmp);
  const auto& want = trainkit::test::golden("optuna.toml");
  tune::OptunaJournal journal(path);
  const auto id = journal.find_study("python_study");
  REQUIRE(id);
  CHECK(*id == 1);  // the deleted study "scratch" took id 0
  CHECK_FALSE(journal.find_study("scratch"));
  CHECK(journal.study(*id).user_attrs.at("owner") == "\"python\"");
  const auto trials = journal.trials_of(*id);
  REQUIRE(static_cast<int64_t>(trials.size()) == *want["study"]["trials"].value<int64_t>());
  const std::vector<std::string> names = {"lr", "width", "act", "momentum"};
  for (const auto* t : trials) {
    const auto& w = *want["trial_" + std::to_string(t->number)].as_table();
    INFO("trial " << t->number);
    CHECK(t->trial_id == *w["trial_id"].value<int64_t>());
    CHECK(static_cast<int>(t->state) == *w["state"].value<int64_t>());
    const double value = *w["value"].value<double>();
    if (std::isnan(value)) {
      CHECK(t->values.empty());
    } else {
      REQUIRE(t->values.size() == 1);
      CHECK(t->values[0] == value);
    }
    const auto params = trainkit::test::values_of<double>(*w["params"].node());
    REQUIRE(t->params.size() == params.size());
    for (size_t i = 0; i < params.size(); ++i) CHECK(t->params.at(names[i]) == params[i]);
    const auto steps = trainkit::test::values_of<double>(*w["steps"].node());
    const auto intermediate = trainkit::test::values_of<double>(*w["intermediate"].node());
    REQUIRE(t->intermediate.size() == steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      const double got = t->intermediate.at(static_cast<int64_t>(steps[i]));
      CHECK((got == intermediate[i] || (std::isnan(got) && std::isnan(intermediate[i]))));
    }
    const std::string note = *w["note"].value<std::string>();
    if (!note.empty()) CHECK(t->user_attrs.at("note") == tune::json_text(note));
  }
}

TEST_CASE("search-space parameters map to Optuna's distributions and internal values", "[tune][journal]") {
  const tune::SearchSpace space = golden_space();
  const auto& p = space.params();
  CHECK(tune::optuna_distribution(p[0]) ==
        R"({"name":"FloatDistribution","attributes":{"step":null,"low":0.0001,"high":0.1,"log":true}})");
  CHECK(tune::optuna_distribution(p[1]) ==
        R"({"name":"IntDistribution","attributes":{"log":false,"step":1,"low":4,"high":64}})");
  CHECK(tune::optuna_distribution(p[2]) ==
        R"({"name":"CategoricalDistribution","attributes":{"choices":["relu","tanh","gelu"]}})");
  // Python's own spelling (spaces after separators) is the same distribution.
  std::string why;
  CHECK(tune::same_distribution(
      R"({"name": "IntDistribution", "attributes": {"log": false, "step": 1, "low": 4, "high": 64}})", p[1], &why));
  CHECK_FALSE(tune::same_distribution(
      R"({"name": "IntDistribution", "attributes": {"log": false, "step": 2, "low": 4, "high": 64}})", p[1], &why));
  CHECK(why == "step 2, not 1");
  CHECK_FALSE(tune::same_distribution(tune::optuna_distribution(p[3]), p[0], &why));
  CHECK(why == "[0, 0.99], not [0.0001, 0.1] log");
  CHECK(tune::optuna_internal(p[2], std::string("gelu")) == 2.0);
  CHECK(std::get<std::string>(tune::optuna_external(p[2], 1.0)) == "tanh");
  CHECK(tune::optuna_internal(p[1], int64_t{20}) == 20.0);
  CHECK(std::get<int64_t>(tune::optuna_external(p[1], 20.0)) == 20);
  CHECK_THROWS_AS(tune::optuna_external(p[2], 3.0), std::invalid_argument);
}

TEST_CASE("a damaged journal line is skipped with a warning naming the file and line", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-damaged");
  const std::string path = copy_golden(tmp);
  auto lines = trainkit::test::lines_of(path);
  lines[12] = lines[12].substr(0, 30);  // line 13 (trial 0's step 0) cut short, then more lines: not a write in progress
  lines[13] = R"({"op_code":42,"worker_id":"w"})";  // line 14 (trial 0's step 1): an op Optuna 5 does not know
  trainkit::test::write_lines(path, lines);
  LogCapture log;
  tune::OptunaJournal journal(path);
  CHECK_THAT(log.text(), Catch::Contains(path + ":13: skipping a damaged journal line (not JSON"));
  CHECK_THAT(log.text(), Catch::Contains(path + ":14: skipping a damaged journal line (unknown op_code 42)"));
  // The rest is read: every trial, and trial 0 without the two intermediate values.
  const auto trials = journal.trials_of(1);
  REQUIRE(trials.size() == 7);
  CHECK(trials[0]->intermediate.empty());
  CHECK(trials[0]->values == std::vector<double>{1.1355540001978883});
  CHECK(trials[1]->intermediate.size() == 2);
  CHECK(journal.lines_read() == static_cast<int64_t>(lines.size()));
}

TEST_CASE("a malformed attribute is skipped with a warning and the rest still loads", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-malformed");
  const std::string path = copy_golden(tmp);
  auto lines = trainkit::test::lines_of(path);
  // Trial 1's CREATE_TRIAL (line 16) with an intermediate value at step "x" (std::stoll once threw on it).
  REQUIRE(lines[15].back() == '}');
  lines[15].insert(lines[15].size() - 1, R"(,"intermediate_values":{"x":0.5},"user_attrs":{"origin":"kept"})");
  trainkit::test::write_lines(path, lines);
  {
    LogCapture log;
    tune::OptunaJournal journal(path);
    CHECK_THAT(log.text(), Catch::Contains(path + ":16: ignoring a damaged field of a journal line (trial 1's "
                                                  "\"intermediate_values\": step \"x\" is not an integer)"));
    const auto trials = journal.trials_of(1);
    REQUIRE(trials.size() == 7);  // trial 1 keeps its number, and later trials their ids
    CHECK(trials[1]->user_attrs.at("origin") == "\"kept\"");
    CHECK(trials[1]->params.size() == 4);
    CHECK(trials[6]->trial_id == 7);
  }
}

TEST_CASE("a torn last line is not read, and is cut before the next append", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-torn");
  const std::string path = copy_golden(tmp);
  const auto lines = trainkit::test::lines_of(path);
  { std::ofstream(path, std::ios::app) << R"({"op_code":4,"worker_id":"killed","study_id":1,"datetime_st)"; }
  tune::OptunaJournal journal(path);
  CHECK(journal.lines_read() == static_cast<int64_t>(lines.size()));
  CHECK(journal.trials_of(1).size() == 7);
  journal.transaction([](tune::JournalBatch& batch) { batch.set_study_user_attr(1, "k", "1"); });
  CHECK(journal.study(1).user_attrs.at("k") == "1");
  const auto after = trainkit::test::lines_of(path);
  REQUIRE(after.size() == lines.size() + 1);
  CHECK(after.back().find("\"user_attr\":{\"k\":1}") != std::string::npos);
  CHECK(tune::OptunaJournal(path).trials_of(1).size() == 7);
}

TEST_CASE("a lock left by a killed writer is broken after the grace period", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-lock");
  const std::string path = copy_golden(tmp);
  tune::OptunaJournal journal(path, tune::OptunaJournalOptions().grace_period_s(1));
  REQUIRE(::symlink(path.c_str(), (path + ".lock").c_str()) == 0);  // what a killed Optuna worker leaves
  std::atomic<bool> done{false};
  const auto start = std::chrono::steady_clock::now();
  std::thread writer([&] {
    journal.transaction([](tune::JournalBatch& batch) { batch.set_study_user_attr(1, "after_lock", "true"); });
    done = true;
  });
  while (!done && std::chrono::steady_clock::now() - start < std::chrono::seconds(15)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!done) fs::remove(path + ".lock");  // let the writer finish before failing
  writer.join();
  CHECK(done.load());
  CHECK(waited >= 1.0);
  CHECK(waited < 10.0);
  CHECK_FALSE(fs::exists(fs::symlink_status(path + ".lock")));
  CHECK(journal.study(1).user_attrs.at("after_lock") == "true");
}

TEST_CASE("a writer waits while another process holds the lock", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-held-lock");
  const std::string path = copy_golden(tmp);
  tune::OptunaJournal journal(path, tune::OptunaJournalOptions().grace_period_s(30));
  REQUIRE(::symlink(path.c_str(), (path + ".lock").c_str()) == 0);  // a live holder
  std::atomic<bool> done{false};
  std::thread writer([&] {
    journal.transaction([](tune::JournalBatch& batch) { batch.set_study_user_attr(1, "waited", "true"); });
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const bool wrote_under_the_lock = done.load();
  fs::remove(path + ".lock");  // the holder releases it
  writer.join();
  CHECK_FALSE(wrote_under_the_lock);
  CHECK(journal.study(1).user_attrs.at("waited") == "true");
}

namespace {

// A point as text ("act=gelu lr=0.001 ..."), every value in its shortest round-trip form: equal text, equal point.
std::string shown(const tune::ParamSet& params) {
  std::string text;
  for (const auto& [name, value] : params) text += name + "=" + tune::to_string(value) + " ";
  return text;
}

tune::Study journal_study(const std::string& path, const tune::SearchSpace& space, const std::string& name,
                          const std::string& direction = "minimize") {
  return tune::Study(space, std::make_shared<tune::RandomSampler>(),
                     tune::StudyOptions().journal(path).study_name(name).direction(direction).seed(5));
}

}  // namespace

TEST_CASE("a Study kept in a journal file is reopened with its trials and continues", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-study");
  const std::string path = tmp.str("study.journal");
  const tune::SearchSpace space = golden_space();
  std::vector<tune::Trial> asked;
  {
    tune::Study study = journal_study(path, space, "lib");
    asked = study.ask(2);
    asked.push_back(study.ask());
    asked.push_back(study.ask());
    CHECK_FALSE(study.report(0, 0, 0.5));
    study.tell(0, 0.25);
    study.report(1, 0, 2.0);
    study.prune(1);
    study.tell(2, NAN);
    study.tell_failed(3);
  }
  // The same suggestions as the study kept in memory: the journal changes where trials live, not what is asked.
  tune::Study memory(space, std::make_shared<tune::RandomSampler>(), tune::StudyOptions().seed(5));
  auto in_memory = memory.ask(2);
  in_memory.push_back(memory.ask());
  for (size_t i = 0; i < 3; ++i) CHECK(shown(in_memory[i].params) == shown(asked[i].params));

  tune::Study again = journal_study(path, space, "lib");
  const auto& trials = again.trials();
  REQUIRE(trials.size() == 4);
  for (size_t i = 0; i < trials.size(); ++i) {
    CHECK(trials[i].number == static_cast<int64_t>(i));
    CHECK(shown(trials[i].params) == shown(asked[i].params));
  }
  CHECK(trials[0].state == tune::TrialState::Complete);
  CHECK(trials[0].value == 0.25);
  CHECK((trials[0].intermediate == std::map<int64_t, double>{{0, 0.5}}));
  CHECK(trials[1].state == tune::TrialState::Pruned);
  CHECK(trials[1].intermediate.at(0) == 2.0);
  CHECK(trials[2].state == tune::TrialState::Failed);
  CHECK(trials[3].state == tune::TrialState::Failed);
  REQUIRE(again.best_trial());
  CHECK(again.best_trial()->number == 0);
  const auto next = again.ask();
  CHECK(next.number == 4);
  CHECK_THROWS_AS(again.tell(0, 1.0), std::logic_error);  // finished in the file, finished here

  // What Optuna reads: one study, minimized, its trials' states and values.
  const tune::OptunaJournal journal(path);
  const auto id = journal.find_study("lib");
  REQUIRE(id);
  CHECK(journal.study(*id).directions == std::vector<int>{1});
  const auto written = journal.trials_of(*id);
  REQUIRE(written.size() == 5);
  CHECK(written[0]->state == tune::OptunaTrialState::Complete);
  CHECK(written[0]->values == std::vector<double>{0.25});
  CHECK(written[1]->state == tune::OptunaTrialState::Pruned);
  CHECK(written[2]->state == tune::OptunaTrialState::Fail);
  CHECK(written[2]->values.empty());
  CHECK(written[4]->state == tune::OptunaTrialState::Running);
  CHECK(written[4]->params.at("act") == tune::optuna_internal(space.params()[2], next.params.at("act")));

  // Two processes' studies on one file: each sees the other's trials after sync(), numbers never collide.
  tune::Study other = journal_study(path, space, "lib");
  const auto theirs = other.ask();
  CHECK(theirs.number == 5);
  CHECK(again.trials().size() == 5);
  again.sync();
  REQUIRE(again.trials().size() == 6);
  CHECK(shown(again.trials()[5].params) == shown(theirs.params));
  CHECK(again.ask().number == 6);

  // add_trial writes the trial, finished, with its reported values.
  tune::Trial restored = asked[0];
  restored.number = 7;
  restored.state = tune::TrialState::Complete;
  restored.value = 0.125;
  restored.intermediate = {{0, 0.3}, {1, 0.2}};
  again.add_trial(restored);
  tune::Study third = journal_study(path, space, "lib");
  REQUIRE(third.trials().size() == 8);
  CHECK(third.trials()[7].value == 0.125);
  CHECK((third.trials()[7].intermediate == restored.intermediate));
  CHECK(third.best_trial()->number == 7);
  restored.number = 7;
  CHECK_THROWS_AS(third.add_trial(restored), std::invalid_argument);
}

TEST_CASE("a Study continues the study Python Optuna wrote, and refuses another space or direction",
          "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-study-python");
  const std::string path = copy_golden(tmp);
  const std::string before = trainkit::test::read_text(path);
  const tune::SearchSpace other = golden_space(128);
  CHECK_THROWS_WITH(journal_study(path, other, "python_study"),
                    path + ":9: the study was run on another search space: trial 0's width is [4, 64], not [4, 128]");
  CHECK_THROWS_WITH(journal_study(path, golden_space(), "python_study", "maximize"),
                    Catch::Contains("study \"python_study\" has directions [1]"));
  CHECK(trainkit::test::read_text(path) == before);

  tune::Study study = journal_study(path, golden_space(), "python_study");
  REQUIRE(study.trials().size() == 7);
  CHECK(std::get<std::string>(study.trials()[0].params.at("act")) == "gelu");
  CHECK(std::get<int64_t>(study.trials()[0].params.at("width")) == 47);
  CHECK(study.trials()[0].value == 1.1355540001978883);
  CHECK(study.trials()[6].state == tune::TrialState::Running);  // Python's, still running
  const auto t = study.ask();
  CHECK(t.number == 7);
  study.tell(t.number, 0.5);
  const tune::OptunaJournal journal(path);
  const auto* written = journal.trials_of(1).at(7);
  CHECK(written->trial_id == 8);  // the deleted study's trial took id 0
  CHECK(written->values == std::vector<double>{0.5});
}

// Run by the ctest `optuna_reads_study_journal`, which sets TRAINKIT_PYTHON to the project's venv.
TEST_CASE("Python Optuna reads the journal a tune::Study wrote, and the Study reads Python's trial",
          "[.journal-python-study]") {
  const char* python = trainkit::test::python_or_null();
  if (!python) TRAINKIT_SKIP("TRAINKIT_PYTHON names no Python; run ctest -R optuna_reads_study_journal");
  trainkit::test::TempDir tmp("journal-python-study");
  const std::string path = tmp.str("study.journal");
  const tune::SearchSpace space = golden_space();
  tune::Study study = journal_study(path, space, "written_by_a_study");
  nlohmann::json expected = {{"trials", nlohmann::json::array()}};
  for (int i = 0; i < 4; ++i) {
    const auto t = study.ask();
    nlohmann::json params = nlohmann::json::object(), intermediate = nlohmann::json::object();
    for (const auto& [name, value] : t.params) std::visit([&params, &key = name](const auto& v) { params[key] = v; }, value);
    for (int64_t step = 0; step < 2; ++step) {
      study.report(t.number, step, 1.0 / static_cast<double>(step + i + 1));
      intermediate[std::to_string(step)] = 1.0 / static_cast<double>(step + i + 1);
    }
    const char* state = i == 1 ? "PRUNED" : i == 2 ? "FAIL" : "COMPLETE";
    if (i == 1) study.prune(t.number);
    else if (i == 2) study.tell(t.number, NAN);
    else study.tell(t.number, 0.5 + i);
    expected["trials"].push_back({{"number", t.number},
                                  {"state", state},
                                  // Pruned: Optuna's value is the last reported one (step 1's).
                                  {"values", i == 2   ? nlohmann::json()
                                             : i == 1 ? nlohmann::json::array({1.0 / 3.0})
                                                      : nlohmann::json::array({0.5 + i})},
                                  {"params", params},
                                  {"intermediate", intermediate},
                                  {"user_attrs", nlohmann::json::object()}});
  }
  std::ofstream(tmp.str("expected.json")) << expected.dump(1);
  using trainkit::test::quoted;
  const std::string log = tmp.str("check.log");
  const std::string command = quoted(python) + " " + quoted(trainkit::test::source_path("scripts/optuna_journal_check.py")) +
                              " read " + quoted(path) + " written_by_a_study " + quoted(tmp.str("expected.json")) +
                              " > " + quoted(log) + " 2>&1";
  const int code = std::system(command.c_str());
  INFO(command << "\n" << trainkit::test::read_text(log));
  CHECK(code == 0);
  // The trial Python added (value 1.0) is read back.
  study.sync();
  REQUIRE(study.trials().size() == 5);
  CHECK(study.trials()[4].state == tune::TrialState::Complete);
  CHECK(study.trials()[4].value == 1.0);
}
