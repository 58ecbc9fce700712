// `trainkit tune`'s study in an Optuna journal file (StudyJournal, over the library's tune::OptunaJournal):
// continuing Python's study, refusing another space, a killed study's running trials, trial directories, a slow
// sampler, concurrent writers (trainkit processes and a Python worker) under the lock, and Python Optuna and
// optuna-dashboard reading what it wrote.
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
#include "trainkit/app/run.h"
#include "trainkit/subprocess.h"
#include "trainkit/tune/optuna_journal.h"
#include "tune/journal_support.h"

namespace fs = std::filesystem;
namespace app = trainkit::app;
namespace tune = trainkit::tune;
using trainkit::test::copy_golden;
using trainkit::test::golden_space;
using trainkit::test::LogCapture;
using trainkit::tune::SearchSpace;

namespace {

std::function<trainkit::tune::Study()> random_study(const SearchSpace& space) {
  return [space] { return trainkit::tune::Study(space, std::make_shared<trainkit::tune::RandomSampler>()); };
}

app::StudyJournalSetup setup_of(const std::string& name) { return {name, "val_loss", "minimize", "space.toml", 30}; }

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

}  // namespace

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
  study.finish(7, tune::OptunaTrialState::Complete, 0.25);
  CHECK(study.records().size() == 7);
  CHECK(study.counted() == 8);
  CHECK(study.ask(9, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; }));
  CHECK_FALSE(study.ask(9, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; }));

  tune::OptunaJournal again(path);
  const auto* t = again.trials_of(1).at(7);
  CHECK(t->trial_id == 8);
  CHECK(t->state == tune::OptunaTrialState::Complete);
  CHECK(t->values == std::vector<double>{0.25});
  CHECK(t->intermediate.at(0) == 0.5);
  CHECK(t->user_attrs.at("trainkit_dir") == "\"trials/python_study/trial-0007\"");
  CHECK(t->user_attrs.at("trainkit_overrides") == "[\"a=1\"]");
}

TEST_CASE("a trainkit worker attribute that is not host:pid is left as it was, with a warning", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-bad-worker");
  const std::string path = copy_golden(tmp);
  const auto lines = trainkit::test::lines_of(path);
  // std::stol once ended the whole tune on it.
  const SearchSpace space = golden_space();
  tune::OptunaJournal(path).transaction([&](tune::JournalBatch& batch) {
    batch.set_trial_system_attr(7, "trainkit_worker", tune::json_text(host_name() + ":not-a-pid"));
  });
  const int64_t worker_line = static_cast<int64_t>(lines.size()) + 1;
  LogCapture log;
  app::StudyJournal study(path, space, setup_of("python_study"), random_study(space));
  CHECK_THAT(log.text(), Catch::Contains(path + ":" + std::to_string(worker_line) +
                                         ": trial 6's trainkit_worker \"" + host_name() +
                                         ":not-a-pid\" is unreadable (not host:pid)"));
  CHECK(study.records().size() == 6);
  CHECK(tune::OptunaJournal(path).trial(7).state == tune::OptunaTrialState::Running);  // left as it was
  REQUIRE(study.ask(9, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; }));
}

TEST_CASE("a journal from another search space is refused naming the line, unchanged", "[tune][journal]") {
  trainkit::test::TempDir tmp("journal-other");
  const std::string path = copy_golden(tmp);
  const std::string before = trainkit::test::read_text(path);
  const SearchSpace other = golden_space(128);
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
  tune::OptunaJournal(path).transaction([&](tune::JournalBatch& batch) {
    batch.set_trial_system_attr(0, "trainkit_worker",
                                tune::json_text(std::string(host) + ":" + std::to_string(dead_pid)));
  });
  app::StudyJournal study(path, space, setup_of("s"), random_study(space));
  CHECK(study.counted() == 0);
  tune::OptunaJournal journal(path);
  CHECK(journal.trial(0).state == tune::OptunaTrialState::Fail);
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
      if (asked[w]) study.finish(asked[w]->trial.number, tune::OptunaTrialState::Complete, 0.5);
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
  for (const auto& line : trainkit::test::lines_of(path)) CHECK_NOTHROW(nlohmann::json::parse(line));
  tune::OptunaJournal journal(path);
  const auto trials = journal.trials_of(*journal.find_study("slow"));
  REQUIRE(trials.size() == 2);
  CHECK(trials[0]->worker_id != trials[1]->worker_id);
  for (const auto* t : trials) {
    CHECK(t->state == tune::OptunaTrialState::Complete);
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
  tune::OptunaJournal(path).transaction([&](tune::JournalBatch& batch) {
    for (size_t i = 0; i < cases.size(); ++i) {
      batch.set_trial_system_attr(static_cast<int64_t>(i), "trainkit_worker", tune::json_text(cases[i].worker));
    }
  });
  app::StudyJournal study(path, space, setup_of("s"), random_study(space));
  tune::OptunaJournal journal(path);
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].what << ": " << cases[i].worker);
    CHECK(journal.trial(static_cast<int64_t>(i)).state ==
          (cases[i].gone ? tune::OptunaTrialState::Fail : tune::OptunaTrialState::Running));
  }
  CHECK(journal.trial(0).system_attrs.count("trainkit_uncounted") == 1);
  // What this process writes names it in full.
  const auto next = study.ask(100, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; });
  REQUIRE(next);
  const auto written = nlohmann::json::parse(tune::OptunaJournal(path).trial(static_cast<int64_t>(cases.size()))
                                                 .system_attrs.at("trainkit_worker"))
                           .get<std::string>();
  CHECK(written == id(host, ::getpid(), boot, pidns, start_ticks(::getpid())));
  live.kill(SIGKILL);
  live.wait();
}

// A writer process of the concurrency test below: TRAINKIT_JOURNAL_WRITER="PATH N KIND" runs N trials of x in
// [0, 1] (value x) on study "shared", through app::StudyJournal (KIND app) or a tune::Study kept in the journal
// (KIND study).
TEST_CASE("journal writer process", "[.journal-writer]") {
  const char* spec = std::getenv("TRAINKIT_JOURNAL_WRITER");
  REQUIRE(spec);
  std::istringstream in(spec);
  std::string path, kind;
  int n = 0;
  in >> path >> n >> kind;
  const SearchSpace space = SearchSpace().add_float("x", 0.0, 1.0);
  if (kind == "study") {
    tune::Study study(space, std::make_shared<tune::RandomSampler>(),
                      tune::StudyOptions().journal(path).study_name("shared").seed(static_cast<uint64_t>(::getpid())));
    for (int i = 0; i < n; ++i) {
      const auto t = study.ask();
      const double x = std::get<double>(t.params.at("x"));
      study.report(t.number, 0, x);
      study.tell(t.number, x);
    }
    return;
  }
  REQUIRE(kind == "app");
  app::StudyJournal study(path, space, setup_of("shared"), random_study(space));
  for (int i = 0; i < n; ++i) {
    const auto t = study.ask(1 << 30, [](const trainkit::tune::Trial&) { return std::vector<std::string>{}; });
    REQUIRE(t);
    const double x = std::get<double>(t->trial.params.at("x"));
    study.report(t->trial.number, 0, x);
    study.finish(t->trial.number, tune::OptunaTrialState::Complete, x);
  }
}

// Run by the ctest `journal_concurrent_writers`, which sets TRAINKIT_PYTHON (without it: the three trainkit
// writers alone).
TEST_CASE("two trainkit tune writers, a tune::Study and a Python Optuna worker share one journal: no trial lost "
          "or doubled",
          "[.journal-concurrent]") {
  trainkit::test::TempDir tmp("journal-concurrent");
  const std::string path = tmp.str("study.journal");
  const int n = 40;
  const char* python = trainkit::test::python_or_null();
  std::vector<trainkit::Subprocess> workers;
  for (int w = 0; w < 3; ++w) {
    const std::string kind = w < 2 ? "app" : "study";
    workers.emplace_back(trainkit::SubprocessOptions()
                             .argv({fs::read_symlink("/proc/self/exe").string(), "[.journal-writer]"})
                             .env({{"TRAINKIT_JOURNAL_WRITER", path + " " + std::to_string(n) + " " + kind}})
                             .log_file(tmp.str("writer" + std::to_string(w) + ".log")));
  }
  if (python) {
    workers.emplace_back(trainkit::SubprocessOptions()
                             .argv({python, trainkit::test::source_path("scripts/optuna_journal_check.py"), "worker",
                                    path, "shared", std::to_string(n)})
                             .log_file(tmp.str("python.log")));
  } else {
    WARN("TRAINKIT_PYTHON names no Python: the trainkit writers only");
  }
  for (size_t w = 0; w < workers.size(); ++w) {
    const auto status = workers[w].wait();
    INFO("worker " << w << ": " << trainkit::test::read_text(tmp.str(w < 3 ? "writer" + std::to_string(w) + ".log"
                                                                           : "python.log")));
    REQUIRE(status.ok());
  }
  const int64_t expected = n * static_cast<int64_t>(workers.size());
  tune::OptunaJournal journal(path);
  const auto trials = journal.trials_of(*journal.find_study("shared"));
  CHECK(static_cast<int64_t>(trials.size()) == expected);
  std::set<std::string> creators;
  for (size_t i = 0; i < trials.size(); ++i) {
    CHECK(trials[i]->number == static_cast<int64_t>(i));
    CHECK(trials[i]->state == tune::OptunaTrialState::Complete);
    REQUIRE(trials[i]->values.size() == 1);
    CHECK(trials[i]->values[0] == trials[i]->params.at("x"));
    creators.insert(trials[i]->worker_id);
  }
  CHECK(creators.size() == workers.size());
  // Each trial was finished exactly once, and every line is whole JSON.
  std::map<int64_t, int> finished;
  for (const auto& line : trainkit::test::lines_of(path)) {
    const auto op = nlohmann::json::parse(line);
    if (op["op_code"] == 6) ++finished[op["trial_id"].get<int64_t>()];
  }
  CHECK(static_cast<int64_t>(finished.size()) == expected);
  for (const auto& [id, count] : finished) CHECK(count == 1);
  CHECK_FALSE(fs::exists(fs::symlink_status(path + ".lock")));
}

// Run by the ctest `optuna_reads_trainkit_journal`, which sets TRAINKIT_PYTHON to the project's venv.
TEST_CASE("Python Optuna reads the study trainkit wrote, and extends it", "[.journal-python]") {
  const char* python = trainkit::test::python_or_null();
  if (!python) TRAINKIT_SKIP("TRAINKIT_PYTHON names no Python; run ctest -R optuna_reads_trainkit_journal");
  trainkit::test::TempDir tmp("journal-python");
  const std::string path = tmp.str("study.journal");
  const SearchSpace space = golden_space();
  app::StudyJournal study(path, space, setup_of("written_by_trainkit"), random_study(space));
  nlohmann::json expected = {{"trials", nlohmann::json::array()}, {"user_attrs", {{"trainkit_metric", "val_loss"}}}};
  const std::vector<std::pair<tune::OptunaTrialState, double>> ends = {{tune::OptunaTrialState::Complete, 0.75},
                                                                 {tune::OptunaTrialState::Pruned, NAN},
                                                                 {tune::OptunaTrialState::Complete, NAN},
                                                                 {tune::OptunaTrialState::Fail, NAN},
                                                                 {tune::OptunaTrialState::Complete, 1e-7},
                                                                 {tune::OptunaTrialState::Pruned, NAN}};
  for (size_t i = 0; i < ends.size(); ++i) {
    const auto t = study.ask(100, [&](const trainkit::tune::Trial&) {
      return std::vector<std::string>{"train.epochs=" + std::to_string(i)};
    });
    REQUIRE(t);
    nlohmann::json params = nlohmann::json::object(), intermediate = nlohmann::json::object();
    for (const auto& [name, value] : t->trial.params) std::visit([&params, &key = name](const auto& v) { params[key] = v; }, value);
    double last = NAN;
    for (int64_t step = 0; step < 3; ++step) {
      last = step == 2 && i == 1 ? NAN : 1.0 / static_cast<double>(step + i + 1);
      study.report(t->trial.number, step, last);
      intermediate[std::to_string(step)] = last;  // NaN: null
    }
    study.finish(t->trial.number, ends[i].first, ends[i].second);
    const bool complete = ends[i].first == tune::OptunaTrialState::Complete && std::isfinite(ends[i].second);
    const bool pruned = ends[i].first == tune::OptunaTrialState::Pruned;
    const char* state = complete ? "COMPLETE" : pruned ? "PRUNED" : "FAIL";
    // A pruned trial's value is its last reported one when finite (Optuna's rule), else null.
    expected["trials"].push_back({{"number", t->trial.number},
                                  {"state", state},
                                  {"values", complete                       ? nlohmann::json::array({ends[i].second})
                                             : pruned && std::isfinite(last) ? nlohmann::json::array({last})
                                                                             : nlohmann::json()},
                                  {"params", params},
                                  {"intermediate", intermediate},
                                  {"user_attrs",
                                   {{"trainkit_dir", t->dir},
                                    {"trainkit_overrides", {"train.epochs=" + std::to_string(i)}}}}});
  }
  std::ofstream(tmp.str("expected.json")) << expected.dump(1);
  const std::string log = tmp.str("check.log");
  using trainkit::test::quoted;
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
  const char* python = trainkit::test::python_or_null();
  if (!python) TRAINKIT_SKIP("TRAINKIT_PYTHON names no Python; run ctest -R optuna_dashboard_serves_journal");
  using trainkit::test::quoted;
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
    study.finish(t->trial.number, pruned ? tune::OptunaTrialState::Pruned : tune::OptunaTrialState::Complete, 0.5 + i);
    expected["trials"].push_back({{"number", t->trial.number},
                                  {"state", pruned ? "PRUNED" : "COMPLETE"},
                                  {"values", nlohmann::json::array({0.5 + i})},  // pruned: its last report
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
