// `trainkit tune`'s study as an Optuna journal file: the reader against a journal Python Optuna wrote (golden),
// Python Optuna against what trainkit writes, concurrent writers (trainkit processes and a Python worker) under
// the lock, and bad input (a damaged line, a torn last line, another search space, a stale lock, a killed
// study's running trial).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "study_journal.h"
#include "support.h"
#include "trainkit/app/optuna_journal.h"
#include "trainkit/app/run.h"
#include "trainkit/subprocess.h"

namespace fs = std::filesystem;
namespace app = trainkit::app;
using trainkit::tune::SearchSpace;
using trainkit::test::LogCapture;

namespace {

// The space of scripts/golden_optuna.py.
SearchSpace golden_space() {
  return SearchSpace()
      .add_float("lr", 1e-4, 1e-1, true)
      .add_int("width", 4, 64)
      .add_categorical("act", {"relu", "tanh", "gelu"})
      .add_float("momentum", 0.0, 0.99);
}

std::function<trainkit::tune::Study()> random_study(const SearchSpace& space) {
  return [space] { return trainkit::tune::Study(space, std::make_shared<trainkit::tune::RandomSampler>()); };
}

app::StudyJournalSetup setup_of(const std::string& name) { return {name, "val_loss", "minimize", "space.toml", 30}; }

std::string copy_golden(const trainkit::test::TempDir& tmp) {
  const std::string path = tmp.str("python_study.journal");
  fs::copy_file(trainkit::test::source_path("tests/golden/optuna/python_study.journal"), path);
  return path;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : lines) out << l << "\n";
}

/// A sampler that takes `seconds` to propose (as a GP fit on many trials may), else RandomSampler.
class SlowSampler : public trainkit::tune::Sampler {
 public:
  explicit SlowSampler(double seconds) : seconds_(seconds) {}
  std::vector<std::vector<double>> suggest(const SearchSpace& space,
                                           const std::vector<trainkit::tune::Observation>& observed,
                                           const std::vector<std::vector<double>>& pending, int64_t q,
                                           uint64_t seed) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds_));
    return trainkit::tune::RandomSampler().suggest(space, observed, pending, q, seed);
  }

 private:
  double seconds_;
};

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Field 22 of /proc/PID/stat: the start time in clock ticks since boot.
uint64_t start_ticks(int64_t pid) {
  const std::string stat = first_line("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream fields(stat.substr(stat.rfind(')') + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) fields >> field;
  return std::stoull(field);
}

uint64_t pid_namespace() {
  char link[64] = {};
  REQUIRE(::readlink("/proc/self/ns/pid", link, sizeof link - 1) > 0);
  const std::string text(link);  // pid:[4026531836]
  return std::stoull(text.substr(text.find('[') + 1));
}

std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

const char* python_or_null() {
  const char* python = std::getenv("TRAINKIT_PYTHON");
  return python && *python && fs::exists(python) ? python : nullptr;
}

}  // namespace

TEST_CASE("a journal Python Optuna wrote replays as Optuna replays it", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-golden");
  const std::string path = copy_golden(tmp);
  const auto want = trainkit::test::golden("optuna.toml");
  app::OptunaJournal journal(path);
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
    if (!note.empty()) CHECK(t->user_attrs.at("note") == app::json_text(note));
  }
}

TEST_CASE("trainkit continues a study Python Optuna created", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-continue");
  const std::string path = copy_golden(tmp);
  const SearchSpace space = golden_space();
  app::StudyJournalSetup setup = setup_of("python_study");
  app::StudyJournal study(path, space, setup, random_study(space));
  CHECK(study.continued());
  CHECK(study.counted() == 7);  // Python's running trial counts: it may still be evaluated
  const auto before = study.records();
  REQUIRE(before.size() == 6);
  CHECK(std::get<std::string>(before[0].trial.params.at("act")) == "gelu");
  CHECK(std::get<int64_t>(before[0].trial.params.at("width")) == 47);
  CHECK(before[0].dir.empty());  // a Python trial has no run directory

  const auto asked = study.ask(9, [](const trainkit::tune::Trial&) { return std::vector<std::string>{"a=1"}; });
  REQUIRE(asked);
  CHECK(asked->trial.number == 7);
  CHECK(asked->dir == "trials/python_study/trial-0007");
  CHECK(fs::is_directory(tmp.path() / "trials/python_study/trial-0007"));
  CHECK_FALSE(study.report(7, 0, 0.5));
  study.finish(7, app::OptunaTrialState::Complete, 0.25);
  CHECK(study.records().size() == 7);
  CHECK(study.counted() == 8);
  CHECK(study.ask(9, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; }));
  CHECK_FALSE(study.ask(9, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; }));

  app::OptunaJournal again(path);
  const auto* t = again.trials_of(1).at(7);
  CHECK(t->trial_id == 8);
  CHECK(t->state == app::OptunaTrialState::Complete);
  CHECK(t->values == std::vector<double>{0.25});
  CHECK(t->intermediate.at(0) == 0.5);
  CHECK(t->user_attrs.at("trainkit_dir") == "\"trials/python_study/trial-0007\"");
  CHECK(t->user_attrs.at("trainkit_overrides") == "[\"a=1\"]");
}

TEST_CASE("search-space parameters map to Optuna's distributions and internal values", "[tune][journal]") {
  const SearchSpace space = golden_space();
  const auto& p = space.params();
  CHECK(app::optuna_distribution(p[0]) ==
        R"({"name":"FloatDistribution","attributes":{"step":null,"low":0.0001,"high":0.1,"log":true}})");
  CHECK(app::optuna_distribution(p[1]) ==
        R"({"name":"IntDistribution","attributes":{"log":false,"step":1,"low":4,"high":64}})");
  CHECK(app::optuna_distribution(p[2]) ==
        R"({"name":"CategoricalDistribution","attributes":{"choices":["relu","tanh","gelu"]}})");
  // Python's own spelling (spaces after separators) is the same distribution.
  std::string why;
  CHECK(app::same_distribution(
      R"({"name": "IntDistribution", "attributes": {"log": false, "step": 1, "low": 4, "high": 64}})", p[1], &why));
  CHECK_FALSE(app::same_distribution(
      R"({"name": "IntDistribution", "attributes": {"log": false, "step": 2, "low": 4, "high": 64}})", p[1], &why));
  CHECK(why == "step 2, not 1");
  CHECK_FALSE(app::same_distribution(app::optuna_distribution(p[3]), p[0], &why));
  CHECK(why == "[0, 0.99], not [0.0001, 0.1] log");
  CHECK(app::optuna_internal(p[2], std::string("gelu")) == 2.0);
  CHECK(std::get<std::string>(app::optuna_external(p[2], 1.0)) == "tanh");
  CHECK(app::optuna_internal(p[1], int64_t{20}) == 20.0);
  CHECK(std::get<int64_t>(app::optuna_external(p[1], 20.0)) == 20);
  CHECK_THROWS_AS(app::optuna_external(p[2], 3.0), std::invalid_argument);
}

TEST_CASE("a damaged journal line is skipped with a warning naming the file and line", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-damaged");
  const std::string path = copy_golden(tmp);
  auto lines = lines_of(path);
  lines[12] = lines[12].substr(0, 30);  // line 13 (trial 0's step 0) cut short, then more lines: not a write in progress
  lines[13] = R"({"op_code":42,"worker_id":"w"})";  // line 14 (trial 0's step 1): an op Optuna 5 does not know
  write_lines(path, lines);
  LogCapture log;
  app::OptunaJournal journal(path);
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
  auto lines = lines_of(path);
  // Trial 1's CREATE_TRIAL (line 16) with an intermediate value at step "x" (std::stoll once threw on it).
  REQUIRE(lines[15].back() == '}');
  lines[15].insert(lines[15].size() - 1, R"(,"intermediate_values":{"x":0.5},"user_attrs":{"origin":"kept"})");
  write_lines(path, lines);
  {
    LogCapture log;
    app::OptunaJournal journal(path);
    CHECK_THAT(log.text(), Catch::Contains(path + ":16: ignoring a damaged field of a journal line (trial 1's "
                                                  "\"intermediate_values\": step \"x\" is not an integer)"));
    const auto trials = journal.trials_of(1);
    REQUIRE(trials.size() == 7);  // trial 1 keeps its number, and later trials their ids
    CHECK(trials[1]->user_attrs.at("origin") == "\"kept\"");
    CHECK(trials[1]->params.size() == 4);
    CHECK(trials[6]->trial_id == 7);
  }
  // A trainkit worker attribute that is not "host:pid" (std::stol once ended the whole tune on it).
  const SearchSpace space = golden_space();
  app::OptunaJournal(path).transaction([&](app::JournalBatch& batch) {
    batch.set_trial_system_attr(7, "trainkit_worker", app::json_text(host_name() + ":not-a-pid"));
  });
  const int64_t worker_line = static_cast<int64_t>(lines.size()) + 1;
  LogCapture log;
  app::StudyJournal study(path, space, setup_of("python_study"), random_study(space));
  CHECK_THAT(log.text(), Catch::Contains(path + ":" + std::to_string(worker_line) +
                                         ": trial 6's trainkit_worker \"" + host_name() +
                                         ":not-a-pid\" is unreadable (not host:pid)"));
  CHECK(study.records().size() == 6);
  CHECK(app::OptunaJournal(path).trial(7).state == app::OptunaTrialState::Running);  // left as it was
  REQUIRE(study.ask(9, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; }));
}

TEST_CASE("a torn last line is not read, and is cut before the next append", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-torn");
  const std::string path = copy_golden(tmp);
  const auto lines = lines_of(path);
  { std::ofstream(path, std::ios::app) << R"({"op_code":4,"worker_id":"killed","study_id":1,"datetime_st)"; }
  app::OptunaJournal journal(path);
  CHECK(journal.lines_read() == static_cast<int64_t>(lines.size()));
  CHECK(journal.trials_of(1).size() == 7);
  journal.transaction([](app::JournalBatch& batch) { batch.set_study_user_attr(1, "k", "1"); });
  CHECK(journal.study(1).user_attrs.at("k") == "1");
  const auto after = lines_of(path);
  REQUIRE(after.size() == lines.size() + 1);
  CHECK(after.back().find("\"user_attr\":{\"k\":1}") != std::string::npos);
  CHECK(app::OptunaJournal(path).trials_of(1).size() == 7);
}

TEST_CASE("a journal from another search space is refused naming the line, unchanged", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-other");
  const std::string path = copy_golden(tmp);
  const std::string before = trainkit::test::read_text(path);
  const SearchSpace other = SearchSpace()
                                .add_float("lr", 1e-4, 1e-1, true)
                                .add_int("width", 4, 128)
                                .add_categorical("act", {"relu", "tanh", "gelu"})
                                .add_float("momentum", 0.0, 0.99);
  CHECK_THROWS_WITH(app::StudyJournal(path, other, setup_of("python_study"), random_study(other)),
                    Catch::Contains(path + ":9: the study was run on another search space: trial 0's width is "
                                           "[4, 64], not [4, 128] (space.toml)"));
  const SearchSpace fewer = SearchSpace().add_float("lr", 1e-4, 1e-1, true);
  CHECK_THROWS_WITH(app::StudyJournal(path, fewer, setup_of("python_study"), random_study(fewer)),
                    Catch::Contains("trial 0's act is a parameter the space does not have"));
  app::StudyJournalSetup maximize = setup_of("python_study");
  maximize.direction = "maximize";
  const SearchSpace space = golden_space();
  CHECK_THROWS_WITH(app::StudyJournal(path, space, maximize, random_study(space)),
                    Catch::Contains("study \"python_study\" has directions [1]"));
  CHECK(trainkit::test::read_text(path) == before);
}

TEST_CASE("a lock left by a killed writer is broken after the grace period", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-lock");
  const std::string path = copy_golden(tmp);
  app::OptunaJournal journal(path, app::OptunaJournalOptions().grace_period_s(1));
  REQUIRE(::symlink(path.c_str(), (path + ".lock").c_str()) == 0);  // what a killed Optuna worker leaves
  std::atomic<bool> done{false};
  const auto start = std::chrono::steady_clock::now();
  std::thread writer([&] {
    journal.transaction([](app::JournalBatch& batch) { batch.set_study_user_attr(1, "after_lock", "true"); });
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
  app::OptunaJournal journal(path, app::OptunaJournalOptions().grace_period_s(30));
  REQUIRE(::symlink(path.c_str(), (path + ".lock").c_str()) == 0);  // a live holder
  std::atomic<bool> done{false};
  std::thread writer([&] {
    journal.transaction([](app::JournalBatch& batch) { batch.set_study_user_attr(1, "waited", "true"); });
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const bool wrote_under_the_lock = done.load();
  fs::remove(path + ".lock");  // the holder releases it
  writer.join();
  CHECK_FALSE(wrote_under_the_lock);
  CHECK(journal.study(1).user_attrs.at("waited") == "true");
}

TEST_CASE("a killed study's running trial on this host ends failed and uncounted", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-stale-trial");
  const std::string path = tmp.str("study.journal");
  const SearchSpace space = SearchSpace().add_float("x", 0.0, 1.0);
  trainkit::Subprocess gone(trainkit::SubprocessOptions().argv({"/bin/true"}));
  const int64_t dead_pid = gone.pid();
  gone.wait();
  {
    app::StudyJournal study(path, space, setup_of("s"), random_study(space));
    REQUIRE(study.ask(5, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; }));
  }
  // Pretend that trial's worker was the process that is gone.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  app::OptunaJournal(path).transaction([&](app::JournalBatch& batch) {
    batch.set_trial_system_attr(0, "trainkit_worker",
                                app::json_text(std::string(host) + ":" + std::to_string(dead_pid)));
  });
  app::StudyJournal study(path, space, setup_of("s"), random_study(space));
  CHECK(study.counted() == 0);
  app::OptunaJournal journal(path);
  CHECK(journal.trial(0).state == app::OptunaTrialState::Fail);
  CHECK(journal.trial(0).system_attrs.count("trainkit_uncounted") == 1);
  const auto next = study.ask(5, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; });
  REQUIRE(next);
  CHECK(next->trial.number == 1);
}

TEST_CASE("trial directories are the study's own, and one left by something else is kept", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-trial-dirs");
  const std::string path = tmp.str("study.journal");
  const SearchSpace space = SearchSpace().add_float("x", 0.0, 1.0);
  const auto none = [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; };
  fs::create_directories(tmp.path() / "trials/s/trial-0000");
  std::ofstream(tmp.path() / "trials/s/trial-0000/keep.txt") << "not this study's";
  fs::create_directories(tmp.path() / "trials/s/trial-0001");  // empty: a worker killed before it appended
  app::StudyJournal study(path, space, setup_of("s"), random_study(space));
  const auto first = study.ask(10, none), second = study.ask(10, none);
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first->dir == "trials/s/trial-0000-1");
  CHECK(trainkit::test::read_text(tmp.str("trials/s/trial-0000/keep.txt")) == "not this study's");
  CHECK(second->dir == "trials/s/trial-0001");
  // A name that is not a plain directory name: one directory under trials/, apart from a name that differs
  // only in the replaced characters.
  app::StudyJournal odd(path, space, setup_of("../a/b c"), random_study(space));
  app::StudyJournal near(path, space, setup_of("../a_b_c"), random_study(space));
  const auto o = odd.ask(10, none), n = near.ask(10, none);
  REQUIRE(o);
  REQUIRE(n);
  CHECK_THAT(o->dir, Catch::Matches(R"(trials/_\._a_b_c-[0-9a-f]{8}/trial-0000)"));
  CHECK_THAT(n->dir, Catch::Matches(R"(trials/_\._a_b_c-[0-9a-f]{8}/trial-0000)"));
  CHECK(o->dir != n->dir);
  CHECK(fs::is_directory(tmp.path() / o->dir));
}

TEST_CASE("a sampler slower than the lock's grace period never holds the lock", "[tune][journal]") {
  // Two workers whose sampler takes 4x the grace period: sampling under the lock would let the waiting worker
  // break it (a warning), both would then append at once, and one would number its trial as the other's.
  trainkit::test::TempDir tmp("journal-slow-sampler");
  const std::string path = tmp.str("study.journal");
  const SearchSpace space = SearchSpace().add_float("x", 0.0, 1.0);
  app::StudyJournalSetup setup = setup_of("slow");
  setup.grace_period_s = 0.5;
  const auto slow_study = [space] {
    return trainkit::tune::Study(space, std::make_shared<SlowSampler>(2.0));
  };
  app::StudyJournal first(path, space, setup, slow_study);
  app::StudyJournal second(path, space, setup, slow_study);
  LogCapture log;
  std::vector<std::optional<app::TrialRecord>> asked(2);
  std::vector<std::string> errors(2);
  const auto work = [&](app::StudyJournal& study, size_t w) {
    try {
      asked[w] = study.ask(10, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; });
      if (asked[w]) study.finish(asked[w]->trial.number, app::OptunaTrialState::Complete, 0.5);
    } catch (const std::exception& e) {
      errors[w] = e.what();
    }
  };
  std::thread a(work, std::ref(first), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::thread b(work, std::ref(second), 1);
  a.join();
  b.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  INFO(log.text());
  CHECK(log.text().find("breaking it") == std::string::npos);
  CHECK(log.text().find("was gone when released") == std::string::npos);
  CHECK(log.text().find("cutting") == std::string::npos);
  CHECK(log.text().find("damaged") == std::string::npos);
  REQUIRE(asked[0]);
  REQUIRE(asked[1]);
  CHECK(asked[0]->trial.number != asked[1]->trial.number);
  CHECK(asked[0]->dir != asked[1]->dir);
  // Every line whole; both trials recorded, each created, owned and finished by its own worker.
  for (const auto& line : lines_of(path)) CHECK_NOTHROW(nlohmann::json::parse(line));
  app::OptunaJournal journal(path);
  const auto trials = journal.trials_of(*journal.find_study("slow"));
  REQUIRE(trials.size() == 2);
  CHECK(trials[0]->worker_id != trials[1]->worker_id);
  for (const auto* t : trials) {
    CHECK(t->state == app::OptunaTrialState::Complete);
    CHECK(t->system_attrs.count("trainkit_worker") == 1);
  }
  CHECK_FALSE(fs::exists(fs::symlink_status(path + ".lock")));
}

TEST_CASE("a gone worker is told by boot id, PID namespace and start time, not by hostname:pid",
          "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-worker-identity");
  const std::string path = tmp.str("study.journal");
  const SearchSpace space = SearchSpace().add_float("x", 0.0, 1.0);
  const std::string boot = first_line("/proc/sys/kernel/random/boot_id");
  REQUIRE(boot.size() == 36);
  const uint64_t pidns = pid_namespace();
  trainkit::Subprocess gone(trainkit::SubprocessOptions().argv({"/bin/true"}));
  const int64_t dead_pid = gone.pid();
  gone.wait();
  trainkit::Subprocess live(trainkit::SubprocessOptions().argv({"/bin/sleep", "60"}));
  const uint64_t live_start = start_ticks(live.pid());
  const std::string host = host_name(), other_boot = "00000000-0000-4000-8000-000000000000";
  const auto id = [](const std::string& h, int64_t pid, const std::string& b, uint64_t ns, uint64_t start) {
    return h + ":" + std::to_string(pid) + " boot=" + b + " pidns=" + std::to_string(ns) + " start=" +
           std::to_string(start);
  };
  struct Case {
    std::string worker;
    bool gone;
    const char* what;
  };
  const std::vector<Case> cases = {
      {id(host, live.pid(), boot, pidns, live_start + 1), true, "a live pid that another process took since"},
      {id(host, dead_pid, boot, pidns + 1, 1), false, "another container (PID namespace) of this kernel"},
      {id(host, live.pid(), boot, pidns, live_start), false, "the live process itself"},
      {id(host, dead_pid, other_boot, pidns, 1), true, "this host before it booted again"},
      {id("another-" + host, dead_pid, other_boot, pidns, 1), false, "another machine"},
      {id("another-" + host, dead_pid, boot, pidns, 1), true, "this kernel and namespace under another hostname"},
      {host + ":" + std::to_string(dead_pid), true, "the old form on this host, its pid gone"},
      {"another-" + host + ":" + std::to_string(dead_pid), false, "the old form of another host"},
  };
  {
    app::StudyJournal study(path, space, setup_of("s"), random_study(space));
    for (size_t i = 0; i < cases.size(); ++i) {
      REQUIRE(study.ask(100, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; }));
    }
  }
  app::OptunaJournal(path).transaction([&](app::JournalBatch& batch) {
    for (size_t i = 0; i < cases.size(); ++i) {
      batch.set_trial_system_attr(static_cast<int64_t>(i), "trainkit_worker", app::json_text(cases[i].worker));
    }
  });
  app::StudyJournal study(path, space, setup_of("s"), random_study(space));
  app::OptunaJournal journal(path);
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].what << ": " << cases[i].worker);
    CHECK(journal.trial(static_cast<int64_t>(i)).state ==
          (cases[i].gone ? app::OptunaTrialState::Fail : app::OptunaTrialState::Running));
  }
  CHECK(journal.trial(0).system_attrs.count("trainkit_uncounted") == 1);
  // What this process writes names it in full.
  const auto next = study.ask(100, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; });
  REQUIRE(next);
  const auto written = nlohmann::json::parse(app::OptunaJournal(path).trial(static_cast<int64_t>(cases.size()))
                                                 .system_attrs.at("trainkit_worker"))
                           .get<std::string>();
  CHECK(written == id(host, ::getpid(), boot, pidns, start_ticks(::getpid())));
  live.kill(SIGKILL);
  live.wait();
}

// A writer process of the concurrency test below: TRAINKIT_JOURNAL_WRITER="PATH N" runs N trials of x in
// [0, 1] (value x) through app::StudyJournal on study "shared".
TEST_CASE("journal writer process", "[.journal-writer]") {
  const char* spec = std::getenv("TRAINKIT_JOURNAL_WRITER");
  REQUIRE(spec);
  std::istringstream in(spec);
  std::string path;
  int n = 0;
  in >> path >> n;
  const SearchSpace space = SearchSpace().add_float("x", 0.0, 1.0);
  app::StudyJournal study(path, space, setup_of("shared"), random_study(space));
  for (int i = 0; i < n; ++i) {
    const auto t = study.ask(1 << 30, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; });
    REQUIRE(t);
    const double x = std::get<double>(t->trial.params.at("x"));
    study.report(t->trial.number, 0, x);
    study.finish(t->trial.number, app::OptunaTrialState::Complete, x);
  }
}

// Run by the ctest `journal_concurrent_writers`, which sets TRAINKIT_PYTHON (without it: the two trainkit
// writers alone).
TEST_CASE("two trainkit writers and a Python Optuna worker share one journal: no trial lost or doubled",
          "[.journal-concurrent]") {
  trainkit::test::TempDir tmp("journal-concurrent");
  const std::string path = tmp.str("study.journal");
  const int n = 40;
  const char* python = python_or_null();
  std::vector<trainkit::Subprocess> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back(trainkit::SubprocessOptions()
                             .argv({fs::read_symlink("/proc/self/exe").string(), "[.journal-writer]"})
                             .env({{"TRAINKIT_JOURNAL_WRITER", path + " " + std::to_string(n)}})
                             .log_file(tmp.str("writer" + std::to_string(w) + ".log")));
  }
  if (python) {
    workers.emplace_back(trainkit::SubprocessOptions()
                             .argv({python, trainkit::test::source_path("scripts/optuna_journal_check.py"), "worker",
                                    path, "shared", std::to_string(n)})
                             .log_file(tmp.str("python.log")));
  } else {
    WARN("TRAINKIT_PYTHON names no Python: two trainkit writers only");
  }
  for (size_t w = 0; w < workers.size(); ++w) {
    const auto status = workers[w].wait();
    INFO("worker " << w << ": " << trainkit::test::read_text(tmp.str(w < 2 ? "writer" + std::to_string(w) + ".log"
                                                                           : "python.log")));
    REQUIRE(status.ok());
  }
  const int64_t expected = n * static_cast<int64_t>(workers.size());
  app::OptunaJournal journal(path);
  const auto trials = journal.trials_of(*journal.find_study("shared"));
  CHECK(static_cast<int64_t>(trials.size()) == expected);
  std::set<std::string> creators;
  for (size_t i = 0; i < trials.size(); ++i) {
    CHECK(trials[i]->number == static_cast<int64_t>(i));
    CHECK(trials[i]->state == app::OptunaTrialState::Complete);
    REQUIRE(trials[i]->values.size() == 1);
    CHECK(trials[i]->values[0] == trials[i]->params.at("x"));
    creators.insert(trials[i]->worker_id);
  }
  CHECK(creators.size() == workers.size());
  // Each trial was finished exactly once, and every line is whole JSON.
  std::map<int64_t, int> finished;
  for (const auto& line : lines_of(path)) {
    const auto op = nlohmann::json::parse(line);
    if (op["op_code"] == 6) ++finished[op["trial_id"].get<int64_t>()];
  }
  CHECK(static_cast<int64_t>(finished.size()) == expected);
  for (const auto& [id, count] : finished) CHECK(count == 1);
  CHECK_FALSE(fs::exists(fs::symlink_status(path + ".lock")));
}

// Run by the ctest `optuna_reads_trainkit_journal`, which sets TRAINKIT_PYTHON to the project's venv.
TEST_CASE("Python Optuna reads the study trainkit wrote, and extends it", "[.journal-python]") {
  const char* python = python_or_null();
  if (!python) TRAINKIT_SKIP("TRAINKIT_PYTHON names no Python; run ctest -R optuna_reads_trainkit_journal");
  trainkit::test::TempDir tmp("journal-python");
  const std::string path = tmp.str("study.journal");
  const SearchSpace space = golden_space();
  app::StudyJournal study(path, space, setup_of("written_by_trainkit"), random_study(space));
  nlohmann::json expected = {{"trials", nlohmann::json::array()}, {"user_attrs", {{"trainkit_metric", "val_loss"}}}};
  const std::vector<std::pair<app::OptunaTrialState, double>> ends = {{app::OptunaTrialState::Complete, 0.75},
                                                                 {app::OptunaTrialState::Pruned, NAN},
                                                                 {app::OptunaTrialState::Complete, NAN},
                                                                 {app::OptunaTrialState::Fail, NAN},
                                                                 {app::OptunaTrialState::Complete, 1e-7}};
  for (size_t i = 0; i < ends.size(); ++i) {
    const auto t = study.ask(100, [&](const trainkit::tune::Trial&) {
      return std::vector<std::string>{"train.epochs=" + std::to_string(i)};
    });
    REQUIRE(t);
    nlohmann::json params = nlohmann::json::object(), intermediate = nlohmann::json::object();
    for (const auto& [name, value] : t->trial.params) std::visit([&params, &key = name](const auto& v) { params[key] = v; }, value);
    for (int64_t step = 0; step < 3; ++step) {
      const double v = step == 2 && i == 1 ? NAN : 1.0 / static_cast<double>(step + i + 1);
      study.report(t->trial.number, step, v);
      intermediate[std::to_string(step)] = v;  // NaN: null
    }
    study.finish(t->trial.number, ends[i].first, ends[i].second);
    const bool complete = ends[i].first == app::OptunaTrialState::Complete && std::isfinite(ends[i].second);
    const char* state = complete ? "COMPLETE" : ends[i].first == app::OptunaTrialState::Pruned ? "PRUNED" : "FAIL";
    expected["trials"].push_back({{"number", t->trial.number},
                                  {"state", state},
                                  {"values", complete ? nlohmann::json::array({ends[i].second}) : nlohmann::json()},
                                  {"params", params},
                                  {"intermediate", intermediate},
                                  {"user_attrs",
                                   {{"trainkit_dir", t->dir},
                                    {"trainkit_overrides", {"train.epochs=" + std::to_string(i)}}}}});
  }
  std::ofstream(tmp.str("expected.json")) << expected.dump(1);
  const std::string log = tmp.str("check.log");
  const auto quoted = [](const std::string& text) { return "\"" + text + "\""; };
  const std::string command = quoted(python) + " " +
                              quoted(trainkit::test::source_path("scripts/optuna_journal_check.py")) + " read " +
                              quoted(path) + " written_by_trainkit " + quoted(tmp.str("expected.json")) + " > " +
                              quoted(log) + " 2>&1";
  const int code = std::system(command.c_str());
  INFO(command << "\n" << trainkit::test::read_text(log));
  CHECK(code == 0);
  // The trial Python added is read back by trainkit.
  study.refresh();
  CHECK(study.records().size() == ends.size() + 1);
}

// Run by the ctest `optuna_dashboard_serves_journal`, which sets TRAINKIT_PYTHON to the project's venv; skipped
// when that Python has no optuna-dashboard (scripts/setup.sh installs it).
TEST_CASE("optuna-dashboard serves the study trainkit wrote", "[.journal-dashboard]") {
  const char* python = python_or_null();
  if (!python) TRAINKIT_SKIP("TRAINKIT_PYTHON names no Python; run ctest -R optuna_dashboard_serves_journal");
  const auto quoted = [](const std::string& text) { return "\"" + text + "\""; };
  const std::string script = quoted(python) + " " + quoted(trainkit::test::source_path("scripts/optuna_dashboard_check.py"));
  if (std::system((script + " probe").c_str()) != 0) {
    TRAINKIT_SKIP("optuna-dashboard is not installed in " << python << " (scripts/setup.sh installs it)");
  }
  trainkit::test::TempDir tmp("journal-dashboard");
  const std::string path = tmp.str("study.journal");
  const SearchSpace space = golden_space();
  app::StudyJournal study(path, space, setup_of("for_the_dashboard"), random_study(space));
  nlohmann::json expected = {{"trials", nlohmann::json::array()}};
  for (int i = 0; i < 3; ++i) {
    const auto t = study.ask(10, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; });
    REQUIRE(t);
    nlohmann::json params = nlohmann::json::object();
    for (const auto& [name, value] : t->trial.params) std::visit([&params, &key = name](const auto& v) { params[key] = v; }, value);
    const bool pruned = i == 1;
    study.report(t->trial.number, 0, 0.5 + i);
    study.finish(t->trial.number, pruned ? app::OptunaTrialState::Pruned : app::OptunaTrialState::Complete, 0.5 + i);
    expected["trials"].push_back({{"number", t->trial.number},
                                  {"state", pruned ? "PRUNED" : "COMPLETE"},
                                  {"values", pruned ? nlohmann::json() : nlohmann::json::array({0.5 + i})},
                                  {"params", params}});
  }
  std::ofstream(tmp.str("expected.json")) << expected.dump(1);
  const std::string log = tmp.str("dashboard.log");
  const std::string command = script + " serve " + quoted(path) + " for_the_dashboard " +
                              quoted(tmp.str("expected.json")) + " > " + quoted(log) + " 2>&1";
  const int code = std::system(command.c_str());
  INFO(command << "\n" << trainkit::test::read_text(log));
  CHECK(code == 0);
}
