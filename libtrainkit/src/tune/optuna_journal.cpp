#include "trainkit/tune/optuna_journal.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace trainkit::tune {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// Optuna's JournalOperation (optuna/storages/journal/_storage.py).
enum Op : int {
  kCreateStudy = 0,
  kDeleteStudy = 1,
  kSetStudyUserAttr = 2,
  kSetStudySystemAttr = 3,
  kCreateTrial = 4,
  kSetTrialParam = 5,
  kSetTrialStateValues = 6,
  kSetTrialIntermediateValue = 7,
  kSetTrialUserAttr = 8,
  kSetTrialSystemAttr = 9,
  kDiscardTrials = 10,
};

// Python's json writes NaN and infinities as bare NaN, Infinity and -Infinity (not JSON); nlohmann reads
// neither, so outside strings they become the strings "NaN", "Infinity", "-Infinity", which number() reads.
std::string quote_non_finite(const std::string& line) {
  std::string out;
  out.reserve(line.size() + 8);
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < line.size()) {
        out += line[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    bool replaced = false;
    for (const char* token : {"NaN", "Infinity", "-Infinity"}) {
      const size_t n = std::strlen(token);
      if (line.compare(i, n, token) == 0) {
        out += fmt::format("\"{}\"", token);
        i += n - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}

// A marker no writer puts in a string (a control character): dump() escapes it as \u0001, so that
// `"\u0001NaN"` in the text can only be a non-finite number, written back bare as Python writes it.
constexpr const char* kNonFinite = "\x01";

ordered_json number_value(double v) {
  if (std::isfinite(v)) return v;
  return std::string(kNonFinite) + (std::isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
}

std::string dump_op(const ordered_json& op) {
  std::string text = op.dump(-1, ' ', true, ordered_json::error_handler_t::replace);
  for (const char* token : {"NaN", "Infinity", "-Infinity"}) {
    const std::string marked = fmt::format("\"\\u0001{}\"", token);
    for (size_t at = text.find(marked); at != std::string::npos; at = text.find(marked, at)) {
      text.replace(at, marked.size(), token);
    }
  }
  return text + "\n";
}

double number(const json& j, const char* what) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == "NaN") return NAN;
    if (s == "Infinity") return INFINITY;
    if (s == "-Infinity") return -INFINITY;
  }
  throw std::runtime_error(fmt::format("{}: expected a number, got {}", what, j.dump()));
}

const json& field(const json& op, const char* key) {
  const auto it = op.find(key);
  if (it == op.end()) throw std::runtime_error(fmt::format("no \"{}\"", key));
  return *it;
}

int64_t integer(const json& op, const char* key) {
  const json& v = field(op, key);
  if (!v.is_number_integer()) throw std::runtime_error(fmt::format("\"{}\": expected an integer, got {}", key, v.dump()));
  return v.get<int64_t>();
}

std::string text_field(const json& op, const char* key) {
  const json& v = field(op, key);
  if (!v.is_string()) throw std::runtime_error(fmt::format("\"{}\": expected a string, got {}", key, v.dump()));
  return v.get<std::string>();
}

void merge_attrs(std::map<std::string, std::string>& attrs, const json& op, const char* key) {
  const json& a = field(op, key);
  if (!a.is_object()) throw std::runtime_error(fmt::format("\"{}\": expected an object", key));
  for (const auto& [k, v] : a.items()) attrs[k] = v.dump();
}

OptunaTrialState trial_state(int64_t v) {
  if (v < 0 || v > 4) throw std::runtime_error(fmt::format("unknown trial state {}", v));
  return static_cast<OptunaTrialState>(v);
}

bool is_finished(OptunaTrialState s) {
  return s == OptunaTrialState::Complete || s == OptunaTrialState::Pruned || s == OptunaTrialState::Fail;
}

std::string now_iso() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:06d}+00:00", buf, us);
}

/// A distribution JSON in either of Optuna's forms ({"name":..,"attributes":..} or the abbreviated
/// {"type":"float",..}), reduced to what compatibility and equality look at.
struct Distribution {
  std::string kind;  // "float", "int", "categorical"
  double low = 0, high = 0;
  bool log = false;
  json step;     // null or a number
  json choices;  // categorical
};

Distribution parse_distribution(const std::string& text) {
  const json j = json::parse(quote_non_finite(text));
  Distribution d;
  const json* a = &j;
  if (j.contains("name")) {
    const std::string name = j.at("name").get<std::string>();
    if (name == "FloatDistribution") d.kind = "float";
    else if (name == "IntDistribution") d.kind = "int";
    else if (name == "CategoricalDistribution") d.kind = "categorical";
    else throw std::runtime_error(fmt::format("unknown distribution {}", name));
    a = &j.at("attributes");
  } else {
    d.kind = j.at("type").get<std::string>();
    if (d.kind == "int") d.step = 1;
  }
  if (d.kind == "categorical") {
    d.choices = a->at("choices");
    return d;
  }
  d.low = number(a->at("low"), "low");
  d.high = number(a->at("high"), "high");
  d.log = a->value("log", false);
  if (a->contains("step")) d.step = a->at("step");
  return d;
}

// optuna.distributions.check_distribution_compatibility: same class; same log flag; same choices.
bool compatible(const std::string& old_text, const std::string& new_text) {
  const Distribution a = parse_distribution(old_text), b = parse_distribution(new_text);
  if (a.kind != b.kind) return false;
  if (a.kind == "categorical") return a.choices == b.choices;
  return a.log == b.log;
}

}  // namespace

const char* to_string(OptunaTrialState state) {
  switch (state) {
    case OptunaTrialState::Running: return "RUNNING";
    case OptunaTrialState::Complete: return "COMPLETE";
    case OptunaTrialState::Pruned: return "PRUNED";
    case OptunaTrialState::Fail: return "FAIL";
    case OptunaTrialState::Waiting: return "WAITING";
  }
  return "?";
}

std::string json_text(const std::string& value) { return json(value).dump(-1, ' ', true, json::error_handler_t::replace); }

std::string json_text(const std::vector<std::string>& values) {
  return json(values).dump(-1, ' ', true, json::error_handler_t::replace);
}

// ---- JournalBatch: one line per op, fields in Optuna's order.

namespace {
ordered_json op_head(int op, const std::string& worker_id) { return {{"op_code", op}, {"worker_id", worker_id}}; }

json parse_value(const std::string& json_value) { return json::parse(quote_non_finite(json_value)); }

// SET_{STUDY,TRIAL}_{USER,SYSTEM}_ATTR: one key per op, as Optuna writes them.
std::string attr_line(int code, const std::string& worker_id, const char* id_field, int64_t id, const char* attr_field,
                      const std::string& key, const std::string& json_value) {
  ordered_json op = op_head(code, worker_id);
  op[id_field] = id;
  op[attr_field] = {{key, parse_value(json_value)}};
  return dump_op(op);
}
}  // namespace

void JournalBatch::create_study(const std::string& name, const std::string& direction) {
  if (direction != "minimize" && direction != "maximize") {
    throw std::invalid_argument(fmt::format("create_study: direction must be minimize or maximize, got {}", direction));
  }
  ordered_json op = op_head(kCreateStudy, worker_id_);
  op["study_name"] = name;
  op["directions"] = {direction == "minimize" ? 1 : 2};
  lines_.push_back(dump_op(op));
}

void JournalBatch::delete_study(int64_t study_id) {
  ordered_json op = op_head(kDeleteStudy, worker_id_);
  op["study_id"] = study_id;
  lines_.push_back(dump_op(op));
}

void JournalBatch::set_study_user_attr(int64_t study_id, const std::string& key, const std::string& json_value) {
  lines_.push_back(attr_line(kSetStudyUserAttr, worker_id_, "study_id", study_id, "user_attr", key, json_value));
}

void JournalBatch::set_study_system_attr(int64_t study_id, const std::string& key, const std::string& json_value) {
  lines_.push_back(attr_line(kSetStudySystemAttr, worker_id_, "study_id", study_id, "system_attr", key, json_value));
}

void JournalBatch::create_trial(int64_t study_id, const std::map<std::string, double>& params,
                                const std::map<std::string, std::string>& distributions,
                                const std::map<std::string, std::string>& user_attrs) {
  ordered_json op = op_head(kCreateTrial, worker_id_);
  op["study_id"] = study_id;
  op["datetime_start"] = now_iso();
  op["state"] = static_cast<int>(OptunaTrialState::Running);
  op["value"] = nullptr;
  op["values"] = nullptr;
  ordered_json dists = ordered_json::object(), internal = ordered_json::object(), attrs = ordered_json::object();
  for (const auto& [name, value] : params) {
    dists[name] = distributions.at(name);
    internal[name] = number_value(value);
  }
  for (const auto& [k, v] : user_attrs) attrs[k] = parse_value(v);
  op["distributions"] = dists;
  op["params"] = internal;
  op["user_attrs"] = attrs;
  op["system_attrs"] = ordered_json::object();
  op["intermediate_values"] = ordered_json::object();
  lines_.push_back(dump_op(op));
}

void JournalBatch::create_trial(int64_t study_id, const SearchSpace& space, const ParamSet& params,
                                const std::map<std::string, std::string>& user_attrs) {
  std::map<std::string, double> internal;
  std::map<std::string, std::string> distributions;
  for (const auto& p : space.params()) {
    internal[p.name] = optuna_internal(p, params.at(p.name));
    distributions[p.name] = optuna_distribution(p);
  }
  create_trial(study_id, internal, distributions, user_attrs);
}

void JournalBatch::set_trial_param(int64_t trial_id, const std::string& name, double internal,
                                   const std::string& distribution) {
  ordered_json op = op_head(kSetTrialParam, worker_id_);
  op["trial_id"] = trial_id;
  op["param_name"] = name;
  op["param_value_internal"] = number_value(internal);
  op["distribution"] = distribution;
  lines_.push_back(dump_op(op));
}

void JournalBatch::set_trial_state_values(int64_t trial_id, OptunaTrialState state, const std::vector<double>& values) {
  ordered_json op = op_head(kSetTrialStateValues, worker_id_);
  op["trial_id"] = trial_id;
  op["state"] = static_cast<int>(state);
  if (values.empty()) {
    op["values"] = nullptr;
  } else {
    op["values"] = ordered_json::array();
    for (double v : values) op["values"].push_back(number_value(v));
  }
  if (state == OptunaTrialState::Running) op["datetime_start"] = now_iso();
  if (is_finished(state)) op["datetime_complete"] = now_iso();
  lines_.push_back(dump_op(op));
}

void JournalBatch::set_trial_intermediate_value(int64_t trial_id, int64_t step, double value) {
  ordered_json op = op_head(kSetTrialIntermediateValue, worker_id_);
  op["trial_id"] = trial_id;
  op["step"] = step;
  op["intermediate_value"] = number_value(value);
  lines_.push_back(dump_op(op));
}

void JournalBatch::set_trial_user_attr(int64_t trial_id, const std::string& key, const std::string& json_value) {
  lines_.push_back(attr_line(kSetTrialUserAttr, worker_id_, "trial_id", trial_id, "user_attr", key, json_value));
}

void JournalBatch::set_trial_system_attr(int64_t trial_id, const std::string& key, const std::string& json_value) {
  lines_.push_back(attr_line(kSetTrialSystemAttr, worker_id_, "trial_id", trial_id, "system_attr", key, json_value));
}

std::string JournalBatch::text() const {
  std::string all;
  for (const auto& l : lines_) all += l;
  return all;
}

// ---- OptunaJournal

OptunaJournal::OptunaJournal(std::string path, OptunaJournalOptions options)
    : file_(std::move(path), JournalFileOptions().grace_period_s(options.grace_period_s())),
      options_(std::move(options)) {
  if (options_.worker_id().empty()) options_.worker_id(new_worker_id());
  sync();
}

void OptunaJournal::sync() {
  for (const std::string& line : file_.read_lines()) {
    const int64_t line_number = lines_read_ + 1;
    // One bad record (edited by hand, a disk error, a writer of another version) must not end every worker of
    // the study: it is skipped with a warning naming it, and the rest of the journal is read.
    std::vector<std::string> ignored;
    try {
      apply(line, line_number, ignored);
    } catch (const std::exception& e) {
      spdlog::warn("{}:{}: skipping a damaged journal line ({}); Python Optuna refuses this journal until that line "
                   "is repaired or removed",
                   path(), line_number, e.what());
      skipped_lines_.push_back(line_number);
    }
    for (const auto& what : ignored) {
      spdlog::warn("{}:{}: ignoring a damaged field of a journal line ({})", path(), line_number, what);
    }
    if (!ignored.empty()) skipped_lines_.push_back(line_number);
    ++lines_read_;
  }
}

void OptunaJournal::transaction(const std::function<void(JournalBatch&)>& fill) {
  JournalBatch batch(worker_id());
  file_.locked([&] {
    sync();
    fill(batch);
    if (!batch.empty()) file_.append(batch.text());
  });
  sync();
}

std::optional<int64_t> OptunaJournal::find_study(const std::string& name) const {
  for (const auto& [id, s] : studies_) {
    if (s.name == name) return id;
  }
  return std::nullopt;
}

std::vector<const JournalTrial*> OptunaJournal::trials_of(int64_t study_id) const {
  std::vector<const JournalTrial*> out;
  for (int64_t id : studies_.at(study_id).trial_ids) out.push_back(&trials_[static_cast<size_t>(id)]);
  return out;
}

// The replay of optuna/storages/journal/_storage.py (JournalStorageReplayResult.apply_logs), without the
// errors Optuna raises only to the worker that wrote an op. Throws (nothing applied) for a line that is not an
// op; a CREATE_TRIAL on a live study always creates its trial, so that the ids of later trials stay those Optuna
// gives them, and a damaged optional field of it is left out and named in `ignored`.
void OptunaJournal::apply(const std::string& line, int64_t line_number, std::vector<std::string>& ignored) {
  if (!line.empty() && line.back() == '\r') return apply(line.substr(0, line.size() - 1), line_number, ignored);
  json op;
  try {
    op = json::parse(quote_non_finite(line));
  } catch (const json::exception& e) {
    throw std::runtime_error(fmt::format("not JSON: {}", e.what()));
  }
  if (!op.is_object()) throw std::runtime_error("not a JSON object");
  const int64_t code = integer(op, "op_code");
  const std::string worker = text_field(op, "worker_id");
  auto updatable = [&](int64_t trial_id) {
    return trial_id >= 0 && trial_id < next_trial_id() && !is_finished(trials_[static_cast<size_t>(trial_id)].state);
  };
  switch (code) {
    case kCreateStudy: {
      const std::string name = text_field(op, "study_name");
      const json& dirs = field(op, "directions");
      if (!dirs.is_array()) throw std::runtime_error("\"directions\": expected an array");
      std::vector<int> directions;
      for (const auto& d : dirs) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > 2) {
          throw std::runtime_error(fmt::format("\"directions\": {} is not a StudyDirection (0, 1 or 2)", d.dump()));
        }
        directions.push_back(d.get<int>());
      }
      if (find_study(name)) return;
      JournalStudy s;
      s.study_id = next_study_id_++;
      s.name = name;
      s.directions = std::move(directions);
      studies_[s.study_id] = std::move(s);
      return;
    }
    case kDeleteStudy: studies_.erase(integer(op, "study_id")); return;
    case kSetStudyUserAttr:
    case kSetStudySystemAttr: {
      const auto it = studies_.find(integer(op, "study_id"));
      if (it == studies_.end()) return;
      if (code == kSetStudyUserAttr) merge_attrs(it->second.user_attrs, op, "user_attr");
      else merge_attrs(it->second.system_attrs, op, "system_attr");
      return;
    }
    case kCreateTrial: {
      const auto it = studies_.find(integer(op, "study_id"));
      if (it == studies_.end()) return;
      JournalTrial t;
      t.trial_id = next_trial_id();
      t.number = static_cast<int64_t>(it->second.trial_ids.size());
      t.study_id = it->first;
      t.worker_id = worker;
      t.line = line_number;
      // Each optional field on its own: a damaged one is left out (the trial marked damaged), the rest kept.
      const auto optional_field = [&](const char* key, const std::function<void(const json&)>& read) {
        const auto f = op.find(key);
        if (f == op.end()) return;
        try {
          read(*f);
        } catch (const std::exception& e) {
          ignored.push_back(fmt::format("trial {}'s \"{}\": {}", t.number, key, e.what()));
          t.damaged = true;
        }
      };
      optional_field("datetime_start", [&](const json& v) {
        if (!v.is_null()) t.datetime_start = v.get<std::string>();
      });
      optional_field("datetime_complete", [&](const json& v) {
        if (v.is_string()) t.datetime_complete = v.get<std::string>();
      });
      optional_field("state", [&](const json& v) {
        if (!v.is_number_integer()) throw std::runtime_error(fmt::format("expected an integer, got {}", v.dump()));
        t.state = trial_state(v.get<int64_t>());
      });
      optional_field("distributions", [&](const json& v) {
        if (!v.is_object()) throw std::runtime_error("expected an object");
        std::map<std::string, std::string> dists;
        for (const auto& [k, d] : v.items()) {
          if (!d.is_string()) throw std::runtime_error(fmt::format("{}: expected a string, got {}", k, d.dump()));
          parse_distribution(d.get<std::string>());
          dists[k] = d.get<std::string>();
        }
        t.distributions = std::move(dists);
      });
      optional_field("params", [&](const json& v) {
        if (!v.is_object()) throw std::runtime_error("expected an object");
        std::map<std::string, double> params;
        for (const auto& [k, p] : v.items()) {
          if (!t.distributions.count(k)) throw std::runtime_error(fmt::format("param {} has no distribution", k));
          params[k] = number(p, k.c_str());
        }
        t.params = std::move(params);
        for (const auto& [k, p] : t.params) t.param_lines[k] = line_number;
      });
      optional_field("user_attrs", [&](const json&) { merge_attrs(t.user_attrs, op, "user_attrs"); });
      optional_field("system_attrs", [&](const json& v) {
        merge_attrs(t.system_attrs, op, "system_attrs");
        for (const auto& [k, a] : v.items()) t.system_attr_lines[k] = line_number;
      });
      optional_field("intermediate_values", [&](const json& v) {
        if (!v.is_object()) throw std::runtime_error("expected an object");
        std::map<int64_t, double> steps;
        for (const auto& [k, x] : v.items()) {
          int64_t step = 0;
          const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), step);
          if (ec != std::errc() || end != k.data() + k.size()) {
            throw std::runtime_error(fmt::format("step \"{}\" is not an integer", k));
          }
          steps[step] = number(x, "value");
        }
        t.intermediate = std::move(steps);
      });
      const bool has_values = op.contains("values") && op["values"].is_array();
      optional_field(has_values ? "values" : "value", [&](const json& v) {
        if (v.is_array()) {
          for (const auto& x : v) t.values.push_back(number(x, "values"));
        } else if (!v.is_null()) {
          t.values.push_back(number(v, "value"));
        }
      });
      it->second.trial_ids.push_back(t.trial_id);
      trials_.push_back(std::move(t));
      return;
    }
    case kSetTrialParam: {
      const int64_t id = integer(op, "trial_id");
      const std::string name = text_field(op, "param_name");
      const double internal = number(field(op, "param_value_internal"), "param_value_internal");
      const std::string dist = text_field(op, "distribution");
      parse_distribution(dist);
      if (!updatable(id)) return;
      JournalTrial& t = trials_[static_cast<size_t>(id)];
      for (int64_t prev : studies_.count(t.study_id) ? studies_[t.study_id].trial_ids : std::vector<int64_t>{}) {
        const auto& p = trials_[static_cast<size_t>(prev)];
        const auto d = p.distributions.find(name);
        if (d == p.distributions.end() || !p.params.count(name)) continue;
        if (!compatible(d->second, dist)) return;
        break;
      }
      t.params[name] = internal;
      t.distributions[name] = dist;
      t.param_lines[name] = line_number;
      return;
    }
    case kSetTrialStateValues: {
      const int64_t id = integer(op, "trial_id");
      const OptunaTrialState state = trial_state(integer(op, "state"));
      if (!updatable(id)) return;
      JournalTrial& t = trials_[static_cast<size_t>(id)];
      if (state == OptunaTrialState::Running && t.state == OptunaTrialState::Running) return;
      // Everything read before anything changes: a damaged line is skipped whole.
      const std::string start = state == OptunaTrialState::Running ? text_field(op, "datetime_start") : "";
      const std::string complete = is_finished(state) ? text_field(op, "datetime_complete") : "";
      const json& values = field(op, "values");
      std::vector<double> read_values;
      if (values.is_array()) {
        for (const auto& v : values) read_values.push_back(number(v, "values"));
      }
      if (state == OptunaTrialState::Running) t.datetime_start = start;
      if (is_finished(state)) t.datetime_complete = complete;
      t.state = state;
      if (values.is_array()) t.values = std::move(read_values);
      return;
    }
    case kSetTrialIntermediateValue: {
      const int64_t id = integer(op, "trial_id");
      const int64_t step = integer(op, "step");
      const double value = number(field(op, "intermediate_value"), "intermediate_value");
      if (updatable(id)) trials_[static_cast<size_t>(id)].intermediate[step] = value;
      return;
    }
    case kSetTrialUserAttr:
    case kSetTrialSystemAttr: {
      const int64_t id = integer(op, "trial_id");
      if (!updatable(id)) return;
      JournalTrial& t = trials_[static_cast<size_t>(id)];
      if (code == kSetTrialUserAttr) {
        merge_attrs(t.user_attrs, op, "user_attr");
      } else {
        merge_attrs(t.system_attrs, op, "system_attr");
        for (const auto& [k, a] : op["system_attr"].items()) t.system_attr_lines[k] = line_number;
      }
      return;
    }
    case kDiscardTrials: return;  // Optuna 5 skips it too (written only by Rustuna)
    default: throw std::runtime_error(fmt::format("unknown op_code {}", code));
  }
}

// ---- Search-space parameters as Optuna's distributions.

std::string optuna_distribution(const Param& p) {
  ordered_json attrs;
  std::string name;
  switch (p.kind) {
    case Param::Kind::Float:
      name = "FloatDistribution";
      attrs = {{"step", nullptr}, {"low", p.low}, {"high", p.high}, {"log", p.log}};
      break;
    case Param::Kind::Int:
      name = "IntDistribution";
      attrs = {{"log", p.log}, {"step", 1}, {"low", static_cast<int64_t>(p.low)}, {"high", static_cast<int64_t>(p.high)}};
      break;
    case Param::Kind::Categorical:
      name = "CategoricalDistribution";
      attrs = {{"choices", p.choices}};
      break;
  }
  return ordered_json{{"name", name}, {"attributes", attrs}}.dump(-1, ' ', true, ordered_json::error_handler_t::replace);
}

bool same_distribution(const std::string& distribution, const Param& p, std::string* why) {
  Distribution d;
  try {
    d = parse_distribution(distribution);
  } catch (const std::exception& e) {
    if (why) *why = fmt::format("unreadable distribution {}: {}", distribution, e.what());
    return false;
  }
  const Distribution want = parse_distribution(optuna_distribution(p));
  std::string differs;
  if (d.kind != want.kind) {
    differs = fmt::format("a {} parameter, not {}", d.kind, want.kind);
  } else if (d.kind == "categorical") {
    if (d.choices != want.choices) differs = fmt::format("choices {}, not {}", d.choices.dump(), want.choices.dump());
  } else if (d.low != want.low || d.high != want.high || d.log != want.log) {
    differs = fmt::format("[{}, {}]{}, not [{}, {}]{}", d.low, d.high, d.log ? " log" : "", want.low, want.high,
                          want.log ? " log" : "");
  } else if (!(d.kind == "float" ? d.step.is_null() : d.step == json(1))) {
    differs = fmt::format("step {}, not {}", d.step.dump(), want.step.dump());
  }
  if (why) *why = differs;
  return differs.empty();
}

double optuna_internal(const Param& p, const ParamValue& value) {
  switch (p.kind) {
    case Param::Kind::Float: return std::get<double>(value);
    case Param::Kind::Int: return static_cast<double>(std::get<int64_t>(value));
    case Param::Kind::Categorical: {
      const auto& s = std::get<std::string>(value);
      for (size_t i = 0; i < p.choices.size(); ++i) {
        if (p.choices[i] == s) return static_cast<double>(i);
      }
      throw std::invalid_argument(fmt::format("{}: \"{}\" is not a choice", p.name, s));
    }
  }
  return NAN;
}

ParamValue optuna_external(const Param& p, double internal) {
  switch (p.kind) {
    case Param::Kind::Float: return internal;
    case Param::Kind::Int: return static_cast<int64_t>(std::llround(internal));
    case Param::Kind::Categorical: {
      const auto i = static_cast<int64_t>(internal);
      if (internal != static_cast<double>(i) || i < 0 || i >= static_cast<int64_t>(p.choices.size())) {
        throw std::invalid_argument(fmt::format("{}: choice index {} out of range", p.name, internal));
      }
      return p.choices[static_cast<size_t>(i)];
    }
  }
  return internal;
}

namespace {

// Where trial `t`'s parameters leave `space`, naming the journal line that set the parameter; empty when they do
// not.
std::string space_mismatch(const OptunaJournal& journal, const JournalTrial& t, const SearchSpace& space) {
  for (const auto& [name, distribution] : t.distributions) {
    const std::string& key = name;  // clang before 16 cannot capture a structured binding
    const auto p = std::find_if(space.params().begin(), space.params().end(),
                                [&](const Param& q) { return q.name == key; });
    std::string why;
    if (p == space.params().end()) why = "a parameter the space does not have";
    else if (same_distribution(distribution, *p, &why)) continue;
    return fmt::format("{}:{}: the study was run on another search space: trial {}'s {} is {}", journal.path(),
                       t.param_lines.at(name), t.number, name, why);
  }
  return {};
}

}  // namespace

std::vector<double> pruned_values(const std::map<int64_t, double>& intermediate) {
  if (intermediate.empty() || !std::isfinite(intermediate.rbegin()->second)) return {};
  return {intermediate.rbegin()->second};
}

std::vector<Trial> study_trials(const OptunaJournal& journal, int64_t study_id, const SearchSpace& space) {
  std::vector<Trial> trials;
  for (const JournalTrial* t : journal.trials_of(study_id)) {
    if (const std::string why = space_mismatch(journal, *t, space); !why.empty()) throw std::invalid_argument(why);
    Trial trial;
    trial.number = t->number;
    switch (t->state) {
      case OptunaTrialState::Complete: trial.state = TrialState::Complete; break;
      case OptunaTrialState::Pruned: trial.state = TrialState::Pruned; break;
      case OptunaTrialState::Fail: trial.state = TrialState::Failed; break;
      default: trial.state = TrialState::Running;
    }
    if (trial.state == TrialState::Complete || trial.state == TrialState::Pruned) {
      trial.value = t->values.empty() ? NAN : t->values.front();
    }
    trial.intermediate = t->intermediate;
    for (const auto& p : space.params()) {
      const auto v = t->params.find(p.name);
      if (v == t->params.end()) continue;
      try {
        trial.params[p.name] = optuna_external(p, v->second);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(fmt::format("{}:{}: trial {}: {}", journal.path(), t->line, t->number, e.what()));
      }
    }
    // A Complete or Pruned trial (its fields read whole) that lacks a parameter is from another space.
    const bool finished = trial.state == TrialState::Complete || trial.state == TrialState::Pruned;
    if (trial.params.size() != space.params().size() && finished && !t->damaged) {
      throw std::invalid_argument(fmt::format("{}:{}: the study was run on another search space: trial {} lacks "
                                              "parameters of the space",
                                              journal.path(), t->line, t->number));
    }
    trials.push_back(std::move(trial));
  }
  return trials;
}

}  // namespace trainkit::tune
