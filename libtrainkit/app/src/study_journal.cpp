#include "study_journal.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <cinttypes>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "trainkit/app/run.h"

namespace trainkit::app {
namespace {

using tune::JournalBatch;
using tune::JournalStudy;
using tune::JournalTrial;
using tune::json_text;
using tune::OptunaTrialState;
using tune::TrialState;

constexpr const char* kDirAttr = "trainkit_dir";
constexpr const char* kOverridesAttr = "trainkit_overrides";
constexpr const char* kWorkerAttr = "trainkit_worker";
constexpr const char* kUncountedAttr = "trainkit_uncounted";
constexpr const char* kMetricAttr = "trainkit_metric";

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::string first_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The kernel's boot id (a UUID, new at every boot, shared by every container of that kernel); empty when unknown.
std::string boot_id() {
  static const std::string id = first_line_of("/proc/sys/kernel/random/boot_id");
  return id;
}

// The inode of this process's PID namespace: pids mean the same process only within one namespace.
std::optional<uint64_t> pid_namespace() {
  char link[64] = {};
  if (::readlink("/proc/self/ns/pid", link, sizeof link - 1) < 0) return std::nullopt;
  uint64_t inode = 0;
  if (std::sscanf(link, "pid:[%" SCNu64 "]", &inode) != 1) return std::nullopt;
  return inode;
}

// Whether all of `text` is a number, which goes to `out`.
template <typename T>
bool parse_number(const std::string& text, T& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

// Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot; empty when there is none.
std::optional<uint64_t> process_start(pid_t pid) {
  const std::string stat = first_line_of(fmt::format("/proc/{}/stat", pid));
  const size_t paren = stat.rfind(')');  // the command name before it may hold spaces and parentheses
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
    uint64_t ticks = 0;
    if (i == 22 && parse_number(field, ticks)) return ticks;
  }
  return std::nullopt;
}

/// A trainkit worker as its `trainkit_worker` attribute names it: "host:pid", and since trainkit knows shared
/// hostnames, " boot=<boot id> pidns=<PID namespace inode> start=<start time in ticks since boot>" after it (an
/// older trainkit reads the pid and stops at the space). The four together name one process on any machine.
struct WorkerId {
  std::string host;
  pid_t pid = 0;
  std::string boot;  // empty in the old form
  uint64_t pidns = 0;
  uint64_t start = 0;
};

std::optional<WorkerId> parse_worker(const std::string& text, std::string* why) {
  std::istringstream words(text);
  std::string head;
  words >> head;
  const size_t colon = head.rfind(':');
  WorkerId w;
  int64_t pid = 0;
  if (colon == std::string::npos || colon == 0 || !parse_number(head.substr(colon + 1), pid) || pid <= 0) {
    *why = "not host:pid";
    return std::nullopt;
  }
  w.host = head.substr(0, colon);
  w.pid = static_cast<pid_t>(pid);
  bool has_ns = false, has_start = false;
  for (std::string word; words >> word;) {
    const size_t eq = word.find('=');
    const std::string key = word.substr(0, eq), value = eq == std::string::npos ? "" : word.substr(eq + 1);
    bool ok = true;
    if (key == "boot") {
      w.boot = value;
      ok = !value.empty();
    } else if (key == "pidns") {
      ok = has_ns = parse_number(value, w.pidns);
    } else if (key == "start") {
      ok = has_start = parse_number(value, w.start);
    }  // other keys: a later trainkit's, ignored
    if (!ok) {
      *why = fmt::format("unreadable \"{}\"", word);
      return std::nullopt;
    }
  }
  if (!w.boot.empty() && !(has_ns && has_start)) {
    *why = "boot= without pidns= and start=";
    return std::nullopt;
  }
  return w;
}

std::string this_worker() {
  const std::string head = fmt::format("{}:{}", host_name(), ::getpid());
  const auto ns = pid_namespace();
  const auto start = process_start(::getpid());
  if (boot_id().empty() || !ns || !start) return head;  // no /proc: the old form, judged by hostname and pid
  return fmt::format("{} boot={} pidns={} start={}", head, boot_id(), *ns, *start);
}

/// Why worker `w` is certainly gone, or nothing when it may be alive (or cannot be checked from here).
std::optional<std::string> gone_because(const WorkerId& w) {
  if (w.boot.empty()) {
    // The old form: only hostname and pid, which processes in containers that share a hostname also match.
    if (w.host != host_name()) return std::nullopt;
    if (::kill(w.pid, 0) == 0 || errno != ESRCH) return std::nullopt;
    return fmt::format("no process {} on host {}", w.pid, w.host);
  }
  const auto ns = pid_namespace();
  if (boot_id().empty() || !ns) return std::nullopt;
  if (w.boot == boot_id()) {
    // This kernel: the pid says something only in the worker's own PID namespace (another container's pids
    // cannot be seen from here), and there the start time tells the worker from a later process of its pid.
    if (w.pidns != *ns) return std::nullopt;
    const auto start = process_start(w.pid);
    if (!start) return fmt::format("no process {} since this machine booted", w.pid);
    if (*start != w.start) {
      return fmt::format("process {} started at tick {}, not {}: another process took its pid", w.pid, *start,
                         w.start);
    }
    return std::nullopt;
  }
  // Another boot: of this machine (its hostname), whose processes all ended, or of another machine.
  if (w.host == host_name()) return fmt::format("host {} was booted again since (boot id {})", w.host, boot_id());
  return std::nullopt;
}

}  // namespace

std::string study_dir_name(const std::string& name) {
  const auto plain = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  };
  bool is_plain = !name.empty() && name.size() <= 100 && name.front() != '.';
  for (char c : name) is_plain = is_plain && plain(c);
  if (is_plain) return name;
  uint32_t hash = 2166136261u;  // FNV-1a
  std::string kept;
  for (char c : name) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 16777619u;
    if (kept.size() < 64) kept += plain(c) ? c : '_';
  }
  if (!kept.empty() && kept.front() == '.') kept.front() = '_';
  return fmt::format("{}{}{:08x}", kept, kept.empty() ? "" : "-", hash);
}

namespace {

// A JSON text attribute that is a string, unquoted.
std::optional<std::string> string_attr(const std::map<std::string, std::string>& attrs, const char* key) {
  const auto it = attrs.find(key);
  if (it == attrs.end()) return std::nullopt;
  const auto j = nlohmann::json::parse(it->second, nullptr, false);
  if (!j.is_string()) return std::nullopt;
  return j.get<std::string>();
}

// Seconds since the epoch of an ISO 8601 time as Python's isoformat writes it ("2026-01-02T03:04:05.123456+00:00").
std::optional<double> epoch_seconds(const std::string& iso) {
  std::tm tm{};
  int us = 0, oh = 0, om = 0;
  char sign = '+';
  const int n = std::sscanf(iso.c_str(), "%d-%d-%dT%d:%d:%d.%d%c%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                            &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &us, &sign, &oh, &om);
  if (n < 6) return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  double t = static_cast<double>(timegm(&tm)) + (n >= 7 ? us * 1e-6 : 0.0);
  if (n == 10) t -= (sign == '-' ? -1 : 1) * (oh * 3600.0 + om * 60.0);
  return t;
}

}  // namespace

StudyJournal::StudyJournal(const std::filesystem::path& path, const tune::SearchSpace& space, StudyJournalSetup setup,
                           std::function<tune::Study()> make_study)
    : journal_(path.string(), tune::OptunaJournalOptions().grace_period_s(setup.grace_period_s)),
      root_(path.has_parent_path() ? path.parent_path() : std::filesystem::path(".")),
      space_(space),
      setup_(std::move(setup)),
      make_study_(std::move(make_study)),
      study_(make_study_()) {
  if (auto id = journal_.find_study(setup_.study_name)) {
    study_id_ = *id;
    continued_ = !journal_.study(*id).trial_ids.empty();
    rebuild();  // checks the trials against the space before anything is written
  }
  // Created under the lock: two workers starting at once create one study.
  journal_.transaction([&](JournalBatch& batch) {
    if (auto id = journal_.find_study(setup_.study_name)) {
      study_id_ = *id;
      return;
    }
    study_id_ = journal_.next_study_id();
    batch.create_study(setup_.study_name, setup_.direction);
    batch.set_study_user_attr(study_id_, kMetricAttr, json_text(setup_.metric));
  });
  rebuild();

  // Running trials of trainkit workers that are gone (a killed study) end as failed and uncounted, so that
  // --trials runs them again, as a killed study that was not in a journal did.
  journal_.transaction([&](JournalBatch& batch) {
    for (const JournalTrial* t : journal_.trials_of(study_id_)) {
      if (t->state != OptunaTrialState::Running) continue;
      const auto attr = t->system_attrs.find(kWorkerAttr);
      if (attr == t->system_attrs.end()) continue;  // not a trainkit worker's
      const auto at = t->system_attr_lines.find(kWorkerAttr);
      const int64_t line = at == t->system_attr_lines.end() ? t->line : at->second;
      const auto worker = string_attr(t->system_attrs, kWorkerAttr);
      std::string why = "not a string";
      const auto id = worker ? parse_worker(*worker, &why) : std::nullopt;
      if (!id) {
        spdlog::warn("{}:{}: trial {}'s {} {} is unreadable ({}); whether its worker is gone is not checked",
                     journal_.path(), line, t->number, kWorkerAttr, attr->second, why);
        continue;
      }
      const auto gone = gone_because(*id);
      if (!gone) continue;
      spdlog::warn("{}: trial {} was left running by a trainkit tune process that is gone ({}: {}); marking it failed",
                   journal_.path(), t->number, *worker, *gone);
      batch.set_trial_system_attr(t->trial_id, kUncountedAttr, json_text("its worker " + *worker + " was gone"));
      batch.set_trial_state_values(t->trial_id, OptunaTrialState::Fail, {});
    }
  });
  rebuild();
}

const JournalTrial& StudyJournal::trial(int64_t number) const {
  return journal_.trial(journal_.study(study_id_).trial_ids.at(static_cast<size_t>(number)));
}

int64_t StudyJournal::counted() const {
  int64_t n = 0;
  for (const JournalTrial* t : journal_.trials_of(study_id_)) n += t->system_attrs.count(kUncountedAttr) ? 0 : 1;
  return n;
}

void StudyJournal::rebuild() {
  if (built_at_ == journal_.lines_read()) return;
  const std::string file = journal_.path();
  const JournalStudy& s = journal_.study(study_id_);
  const std::string want = setup_.direction == "minimize" ? "[1]" : "[2]";
  if (nlohmann::json(s.directions).dump() != want) {
    throw UsageError(fmt::format("{}: study \"{}\" has directions {} (1 minimize, 2 maximize); this run {}s one value",
                                 file, s.name, nlohmann::json(s.directions).dump(), setup_.direction));
  }
  if (const auto metric = string_attr(s.user_attrs, kMetricAttr); metric && *metric != setup_.metric) {
    throw UsageError(fmt::format("{}: study \"{}\" tunes {}, this run's metric is {}", file, s.name, *metric,
                                 setup_.metric));
  }
  std::vector<tune::Trial> trials;
  try {
    trials = tune::study_trials(journal_, study_id_, space_);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("{} ({})", e.what(), setup_.space_path));
  }
  tune::Study study = make_study_();
  std::map<int64_t, int64_t> local_of;
  for (tune::Trial& trial : trials) {
    // A trial that Python Optuna created and has not given every parameter yet (or that failed before, or whose
    // unreadable fields were named when it was read): not a point of this space.
    if (trial.params.size() != space_.params().size()) continue;
    local_of[trial.number] = static_cast<int64_t>(study.trials().size());
    trial.number = local_of[trial.number];
    study.add_trial(std::move(trial));
  }
  study_ = std::move(study);
  local_of_ = std::move(local_of);
  built_at_ = journal_.lines_read();
}

void StudyJournal::refresh() {
  journal_.sync();
  rebuild();
}

std::string StudyJournal::claim_dir(int64_t number) const {
  const std::string dir = fmt::format("trials/{}/trial-{:04d}", study_dir_name(setup_.study_name), number);
  std::filesystem::create_directories((root_ / dir).parent_path());
  // Directories are claimed under the lock and the number is taken in the same hold, so an empty one is what a
  // worker killed between the two left, and is taken. One with content was left by something else (a journal
  // removed, a study deleted and created again): it is kept, and the trial runs beside it.
  for (int k = 0;; ++k) {
    const std::string candidate = k == 0 ? dir : fmt::format("{}-{}", dir, k);
    if (std::filesystem::create_directory(root_ / candidate) || std::filesystem::is_empty(root_ / candidate)) {
      if (k > 0) {
        spdlog::warn("{}: exists and is not a trial of this study in {}; trial {} runs in {}", (root_ / dir).string(),
                     journal_.path(), number, candidate);
      }
      return candidate;
    }
  }
}

std::optional<TrialRecord> StudyJournal::ask(
    int64_t max_trials, const std::function<std::vector<std::string>(const tune::Trial&)>& overrides) {
  // As Optuna: read every worker's trials, sample without the lock (a GP fit may take longer than the lock's
  // grace period, after which other workers would break the lock), then append under the lock. The number is
  // the one the replay gives the appended CREATE_TRIAL, whatever other workers appended meanwhile.
  refresh();
  if (counted() >= max_trials) return std::nullopt;
  tune::Trial t = study_.ask();
  built_at_ = -1;  // study_ now holds t as its own pending trial; rebuilt from the journal below
  std::optional<TrialRecord> asked;
  journal_.transaction([&](JournalBatch& batch) {
    if (counted() >= max_trials) return;  // other workers filled the study while this one sampled
    t.number = static_cast<int64_t>(journal_.study(study_id_).trial_ids.size());
    const std::string dir = claim_dir(t.number);
    batch.create_trial(study_id_, space_, t.params, {{kDirAttr, json_text(dir)}, {kOverridesAttr, json_text(overrides(t))}});
    batch.set_trial_system_attr(journal_.next_trial_id(), kWorkerAttr, json_text(this_worker()));
    asked = TrialRecord{t, 0, dir};
  });
  if (asked) {
    const JournalTrial& created = trial(asked->trial.number);
    if (created.worker_id != journal_.worker_id()) {
      throw std::runtime_error(fmt::format("{}: trial {} was created by another worker while this one held the lock "
                                           "(a writer that does not take the lock?)",
                                           journal_.path(), asked->trial.number));
    }
  }
  rebuild();
  return asked;
}

bool StudyJournal::reported(int64_t number, int64_t step) const { return trial(number).intermediate.count(step) > 0; }

bool StudyJournal::report(int64_t number, int64_t step, double value) {
  const int64_t id = trial(number).trial_id;
  journal_.transaction([&](JournalBatch& batch) { batch.set_trial_intermediate_value(id, step, value); });
  rebuild();
  const auto local = local_of_.find(number);
  if (local == local_of_.end() || study_.trials()[static_cast<size_t>(local->second)].state != TrialState::Running) {
    return false;
  }
  return study_.report(local->second, step, value);
}

void StudyJournal::finish(int64_t number, OptunaTrialState state, double value, const std::string& uncounted) {
  const int64_t id = trial(number).trial_id;
  const std::vector<double> pruned = tune::pruned_values(trial(number).intermediate);
  journal_.transaction([&](JournalBatch& batch) {
    if (!uncounted.empty()) {
      batch.set_trial_system_attr(id, kUncountedAttr, json_text(uncounted));
      batch.set_trial_state_values(id, OptunaTrialState::Fail, {});
    } else if (state == OptunaTrialState::Complete && std::isfinite(value)) {
      batch.set_trial_state_values(id, OptunaTrialState::Complete, {value});
    } else if (state == OptunaTrialState::Pruned) {
      batch.set_trial_state_values(id, OptunaTrialState::Pruned, pruned);  // Optuna: the last reported value
    } else {
      // Optuna's own rule: a NaN or infinite objective fails the trial, its value left null.
      batch.set_trial_state_values(id, state == OptunaTrialState::Complete ? OptunaTrialState::Fail : state, {});
    }
  });
  rebuild();
}

std::vector<TrialRecord> StudyJournal::records() {
  std::vector<TrialRecord> out;
  const std::vector<tune::Trial> trials = tune::study_trials(journal_, study_id_, space_);
  for (const JournalTrial* t : journal_.trials_of(study_id_)) {
    if (t->state == OptunaTrialState::Running || t->state == OptunaTrialState::Waiting) continue;
    if (t->system_attrs.count(kUncountedAttr)) continue;
    const tune::Trial& trial = trials.at(static_cast<size_t>(t->number));
    if (trial.params.size() != space_.params().size()) continue;
    TrialRecord r{trial, 0, string_attr(t->user_attrs, kDirAttr).value_or("")};
    const auto start = epoch_seconds(t->datetime_start), end = epoch_seconds(t->datetime_complete);
    if (start && end) r.seconds = *end - *start;
    out.push_back(std::move(r));
  }
  return out;
}

void StudyJournal::import(const std::vector<TrialRecord>& records) {
  journal_.transaction([&](JournalBatch& batch) {
    int64_t id = journal_.next_trial_id();
    for (const auto& r : records) {
      batch.create_trial(study_id_, space_, r.trial.params, {{kDirAttr, json_text(r.dir)}});
      for (const auto& [step, v] : r.trial.intermediate) batch.set_trial_intermediate_value(id, step, v);
      const OptunaTrialState state = r.trial.state == TrialState::Complete ? OptunaTrialState::Complete
                                     : r.trial.state == TrialState::Pruned ? OptunaTrialState::Pruned
                                                                           : OptunaTrialState::Fail;
      batch.set_trial_state_values(id, state,
                                   state == OptunaTrialState::Complete ? std::vector<double>{r.trial.value}
                                   : state == OptunaTrialState::Pruned ? tune::pruned_values(r.trial.intermediate)
                                                                       : std::vector<double>{});
      ++id;
    }
  });
  rebuild();
}

}  // namespace trainkit::app
