#include "trainkit/app/tune_job.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "trainkit/app/config.h"
#include "trainkit/app/main.h"
#include "trainkit/app/run.h"
#include "trainkit/app/toml_args.h"
#include "trainkit/log/svg_plot.h"
#include "trainkit/train/checkpoint.h"

namespace trainkit::app {
namespace {

namespace fs = std::filesystem;
using tune::Param;
using tune::ParamSet;
using tune::ParamValue;
using tune::SearchSpace;
using tune::Trial;
using tune::TrialState;

constexpr int kStudyVersion = 1;

// ---- A small JSON reader for the study file, metrics.jsonl and summary.json (numbers may be nan/inf, as
// trainkit's metrics writer prints them).
struct Json {
  struct Member;  // a key and its value; a pair<string, Json> here would need Json complete (clang)
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  double number = 0;
  bool boolean = false;
  std::string string;
  std::vector<Json> array;
  std::vector<Member> object;
  const Json* get(const std::string& key) const;
};

struct Json::Member {
  std::string key;
  Json value;
};

const Json* Json::get(const std::string& key) const {
  for (const auto& [k, v] : object) {
    if (k == key) return &v;
  }
  return nullptr;
}

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}
  Json parse() {
    Json v = value();
    skip();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw std::runtime_error(fmt::format("JSON: {} at character {}", what, i_ + 1));
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  std::string str() {
    if (!eat('"')) fail("expected a string");
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) ++i_;
      out += s_[i_++];
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  Json value() {
    skip();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Json::Kind::Object;
      if (eat('}')) return v;
      do {
        std::string k = str();
        if (!eat(':')) fail("expected ':'");
        v.object.push_back({std::move(k), value()});
      } while (eat(','));
      if (!eat('}')) fail("expected '}'");
    } else if (c == '[') {
      ++i_;
      v.kind = Json::Kind::Array;
      if (eat(']')) return v;
      do {
        v.array.push_back(value());
      } while (eat(','));
      if (!eat(']')) fail("expected ']'");
    } else if (c == '"') {
      v.kind = Json::Kind::String;
      v.string = str();
    } else if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 5, "false") == 0) {
      v.kind = Json::Kind::Bool;
      v.boolean = s_[i_] == 't';
      i_ += v.boolean ? 4 : 5;
    } else if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else {
      size_t end = i_;
      while (end < s_.size() && std::string("+-.0123456789eEnaifINAF").find(s_[end]) != std::string::npos) ++end;
      if (end == i_) fail("unexpected character");
      const std::string tok = s_.substr(i_, end - i_);
      v.kind = Json::Kind::Number;
      try {
        v.number = std::stod(tok);
      } catch (const std::exception&) {
        fail("bad number");
      }
      i_ = end;
    }
    return v;
  }
  const std::string& s_;
  size_t i_ = 0;
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

std::string read_text(const fs::path& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(fmt::format("{}: cannot open", path.string()));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---- The search-space file.

[[noreturn]] void space_error(const std::string& path, const std::string& key, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}: {}", path, key, what), key);
}

double number_field(const std::string& path, const std::string& name, const ArgTable& t, const char* field) {
  const ArgValue* v = find_arg(t, field);
  if (!v) space_error(path, name, fmt::format("missing \"{}\"", field));
  const auto n = v->as_number();
  if (!n) space_error(path, name, fmt::format("{}: expected a number, got {}", field, v->to_string()));
  return *n;
}

void add_param(SearchSpace& space, const std::string& path, const std::string& name, const ArgTable& t) {
  const std::set<std::string> known = {"type", "low", "high", "log", "choices"};
  for (const auto& [k, v] : t) {
    if (!known.count(k)) space_error(path, name, fmt::format("unknown field \"{}\" (known: type, low, high, log, choices)", k));
  }
  const auto* type = find_arg(t, "type")->get_if<std::string>();
  if (!type) space_error(path, name, "type: expected \"float\", \"int\" or \"categorical\"");
  bool log = false;
  if (const ArgValue* l = find_arg(t, "log")) {
    const auto* b = l->get_if<bool>();
    if (!b) space_error(path, name, fmt::format("log: expected true or false, got {}", l->to_string()));
    log = *b;
  }
  try {
    if (*type == "float") {
      space.add_float(name, number_field(path, name, t, "low"), number_field(path, name, t, "high"), log);
    } else if (*type == "int") {
      auto integer = [&](const char* field) {
        const ArgValue* v = find_arg(t, field);
        if (!v || !v->get_if<int64_t>()) space_error(path, name, fmt::format("{}: expected an integer", field));
        return *v->get_if<int64_t>();
      };
      space.add_int(name, integer("low"), integer("high"), log);
    } else if (*type == "categorical") {
      const ArgValue* c = find_arg(t, "choices");
      const auto* a = c ? c->get_if<ArgValue::Array>() : nullptr;
      if (!a) space_error(path, name, "choices: expected an array of strings");
      std::vector<std::string> choices;
      for (const auto& v : *a) {
        const auto* s = v.get_if<std::string>();
        if (!s) space_error(path, name, fmt::format("choices: expected strings, got {}", v.to_string()));
        choices.push_back(*s);
      }
      space.add_categorical(name, choices);
    } else {
      space_error(path, name, fmt::format("type: expected \"float\", \"int\" or \"categorical\", got \"{}\"", *type));
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    // SearchSpace's own messages start with the parameter's name.
    throw ConfigError(fmt::format("{}: {}", path, e.what()), name);
  }
}

void walk_space(SearchSpace& space, const std::string& path, const std::string& prefix, const ArgTable& table) {
  for (const auto& [key, value] : table) {
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    const auto* t = value.get_if<ArgTable>();
    if (!t) {
      space_error(path, name, fmt::format("expected a table with type = \"float\" | \"int\" | \"categorical\" "
                                          "(line {})", value.line()));
    }
    if (find_arg(*t, "type")) {
      add_param(space, path, name, *t);
    } else {
      walk_space(space, path, name, *t);
    }
  }
}

// ---- Trials as `--set` overrides and as study-file lines.

std::vector<std::string> overrides_of(const ParamSet& params) {
  std::vector<std::string> out;
  for (const auto& [name, value] : params) {
    if (const auto* s = std::get_if<std::string>(&value)) {
      out.push_back(fmt::format("{}=\"{}\"", name, *s));
    } else {
      out.push_back(fmt::format("{}={}", name, tune::to_string(value)));
    }
  }
  return out;
}

ParamValue parse_value(const Param& p, const std::string& text) {
  switch (p.kind) {
    case Param::Kind::Float: return std::stod(text);
    case Param::Kind::Int: return static_cast<int64_t>(std::stoll(text));
    case Param::Kind::Categorical: return text;
  }
  return text;
}

struct TrialRecord {
  Trial trial;
  double seconds = 0;
  std::string dir;  // relative to the study directory
};

std::string trial_line(const TrialRecord& r) {
  std::string params;
  for (const auto& [name, value] : r.trial.params) {
    params += fmt::format("{}{}:{}", params.empty() ? "" : ",", json_string(name), json_string(tune::to_string(value)));
  }
  std::string inter;
  for (const auto& [step, value] : r.trial.intermediate) {
    inter += fmt::format("{}[{},{}]", inter.empty() ? "" : ",", step, json_number(value));
  }
  return fmt::format("{{\"number\":{},\"state\":\"{}\",\"value\":{},\"seconds\":{:.3f},\"dir\":{},\"params\":{{{}}},"
                     "\"intermediate\":[{}]}}\n",
                     r.trial.number, tune::to_string(r.trial.state), json_number(r.trial.value), r.seconds,
                     json_string(r.dir), params, inter);
}

std::string header_line(const SearchSpace& space, const TuneJobOptions& o, const std::string& direction) {
  return fmt::format("{{\"trainkit_study\":{},\"space\":{},\"metric\":{},\"direction\":{},\"seed\":{}}}\n",
                     kStudyVersion, json_string(space.fingerprint()), json_string(o.metric), json_string(direction),
                     o.seed);
}

TrialRecord parse_trial(const Json& j, const SearchSpace& space, const std::string& where) {
  TrialRecord r;
  const Json* state = j.get("state");
  const Json* params = j.get("params");
  if (!state || !params || params->kind != Json::Kind::Object) throw UsageError(where + ": not a trial record");
  const std::map<std::string, TrialState> states = {
      {"complete", TrialState::Complete}, {"pruned", TrialState::Pruned}, {"failed", TrialState::Failed}};
  const auto s = states.find(state->string);
  if (s == states.end()) throw UsageError(fmt::format("{}: unknown state \"{}\"", where, state->string));
  r.trial.state = s->second;
  if (const Json* v = j.get("value"); v && v->kind == Json::Kind::Number) r.trial.value = v->number;
  if (const Json* v = j.get("seconds"); v && v->kind == Json::Kind::Number) r.seconds = v->number;
  if (const Json* v = j.get("dir")) r.dir = v->string;
  for (const auto& p : space.params()) {
    const Json* v = params->get(p.name);
    if (!v || v->kind != Json::Kind::String) throw UsageError(fmt::format("{}: no value for {}", where, p.name));
    try {
      r.trial.params[p.name] = parse_value(p, v->string);
    } catch (const std::exception&) {
      throw UsageError(fmt::format("{}: {}: cannot read \"{}\"", where, p.name, v->string));
    }
  }
  if (const Json* inter = j.get("intermediate")) {
    for (const auto& pair : inter->array) {
      if (pair.array.size() == 2) {
        r.trial.intermediate[static_cast<int64_t>(pair.array[0].number)] =
            pair.array[1].kind == Json::Kind::Number ? pair.array[1].number : NAN;
      }
    }
  }
  return r;
}

// ---- Reading a finished run's objective.

/// The metric's values in the run's per-epoch rows of metrics.jsonl (those carry the validation metrics), by epoch.
std::map<int64_t, double> val_history(const fs::path& run_dir, const std::string& metric) {
  std::map<int64_t, double> out;
  std::ifstream f(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    if (line.find("\"kind\":\"epoch\"") == std::string::npos) continue;
    try {
      const Json j = JsonParser(line).parse();
      const Json* v = j.get(metric);
      const Json* e = j.get("epoch");
      if (v && e) out[static_cast<int64_t>(e->number)] = v->kind == Json::Kind::Number ? v->number : NAN;
    } catch (const std::exception&) {
      // A line being written while we read it: the next poll sees it whole.
    }
  }
  return out;
}

double objective(const fs::path& run_dir, const std::string& metric) {
  if (metric.rfind("val_", 0) == 0) {
    const auto h = val_history(run_dir, metric);
    return h.empty() ? NAN : h.rbegin()->second;
  }
  const Json j = JsonParser(read_text(run_dir / "summary.json")).parse();
  const Json* v = j.get(metric);
  return v && v->kind == Json::Kind::Number ? v->number : NAN;
}

// ---- Child processes.

pid_t spawn(const std::vector<std::string>& args, const fs::path& log_path) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(fmt::format("tune: fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // a killed study takes its trials along
    if (getppid() != parent) _exit(127);
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

struct Running {
  Trial trial;
  pid_t pid = 0;
  std::string dir;
  std::chrono::steady_clock::time_point start;
  bool pruned = false;
};

// ---- Outputs.

void write_outputs(const fs::path& out, const SearchSpace& space, const std::vector<TrialRecord>& records,
                   bool minimize, const std::string& metric) {
  std::string csv = "number,state," + metric;
  for (const auto& p : space.params()) csv += fmt::format(",{}", p.name);
  csv += ",seconds,dir\n";
  std::vector<double> xs, best_so_far;
  double best = NAN;
  const TrialRecord* best_record = nullptr;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    csv += fmt::format("{},{},{}", r.trial.number, tune::to_string(r.trial.state),
                       r.trial.state == TrialState::Complete ? fmt::format("{}", r.trial.value) : "");
    for (const auto& p : space.params()) csv += fmt::format(",{}", tune::to_string(r.trial.params.at(p.name)));
    csv += fmt::format(",{:.1f},{}\n", r.seconds, r.dir);
    if (r.trial.state == TrialState::Complete &&
        (std::isnan(best) || (minimize ? r.trial.value < best : r.trial.value > best))) {
      best = r.trial.value;
      best_record = &r;
    }
    if (!std::isnan(best)) {
      xs.push_back(static_cast<double>(i + 1));
      best_so_far.push_back(best);
    }
  }
  train::write_file_atomic((out / "trials.csv").string(), csv);
  if (best_record) {
    const fs::path cfg = out / best_record->dir / "config.toml";
    std::string text = fmt::format("# The best trial of the study in {}: trial {}, {} = {}\n# Tuned:",
                                   out.string(), best_record->trial.number, metric, best_record->trial.value);
    for (const auto& o : overrides_of(best_record->trial.params)) text += " --set " + o;
    text += "\n";
    if (fs::exists(cfg)) text += read_text(cfg);
    train::write_file_atomic((out / "best.toml").string(), text);
  }
  log::SvgPlot plot(log::PlotOptions().title("trainkit tune: best " + metric + " so far").x_label("finished trials")
                        .y_label(metric));
  plot.add_series({"best so far", xs, best_so_far, true});
  plot.save((out / "best_so_far.svg").string());
}

}  // namespace

tune::SearchSpace load_search_space(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw ConfigError(fmt::format("{}: cannot open the search-space file", path));
  std::stringstream ss;
  ss << f.rdbuf();
  SearchSpace space;
  walk_space(space, path, "", parse_toml(ss.str(), path));
  if (space.empty()) throw ConfigError(fmt::format("{}: no parameters (expected tables like [optimizer.lr])", path));
  return space;
}

TuneJobResult run_tune_job(const TuneJobOptions& o) {
  if (o.config_path.empty() || o.space_path.empty() || o.out_dir.empty()) {
    throw UsageError("tune: --config, --space and --out are required");
  }
  if (o.trials < 1) throw UsageError(fmt::format("tune: --trials must be >= 1, got {}", o.trials));
  if (o.jobs < 1) throw UsageError(fmt::format("tune: --jobs must be >= 1, got {}", o.jobs));
  if (o.metric.rfind("val_", 0) != 0 && o.metric.rfind("test_", 0) != 0) {
    throw UsageError(fmt::format("tune: --metric must start with val_ or test_, got \"{}\"", o.metric));
  }
  if (o.prune && o.metric.rfind("val_", 0) != 0) {
    throw UsageError("tune: --prune needs a val_ metric (the per-epoch validation rows are what it compares)");
  }
  if (o.sampler != "gp" && o.sampler != "random") {
    throw UsageError(fmt::format("tune: --sampler must be gp or random, got \"{}\"", o.sampler));
  }
  const std::string direction =
      !o.direction.empty() ? o.direction : (o.metric.find("accuracy") != std::string::npos ? "maximize" : "minimize");
  const SearchSpace space = load_search_space(o.space_path);

  // Every tuned key at both ends of its range must be a key `trainkit train` accepts with that value.
  load_config(o.config_path, o.overrides);
  for (const auto& p : space.params()) {
    for (double end : {0.0, 1.0}) {
      std::vector<double> u(static_cast<size_t>(space.dims()), 0.5);
      size_t k = 0;
      for (const auto& q : space.params()) {
        if (q.name == p.name) break;
        k += q.kind == Param::Kind::Categorical ? q.choices.size() : 1;
      }
      u[k] = end;
      const ParamSet point = space.decode(u);
      auto overrides = o.overrides;
      overrides.push_back(overrides_of({{p.name, point.at(p.name)}}).front());
      try {
        load_config(o.config_path, overrides);
      } catch (const std::invalid_argument& e) {
        throw ConfigError(fmt::format("{}: {}: not accepted by the config at {}: {}", o.space_path, p.name,
                                      tune::to_string(point.at(p.name)), e.what()),
                          p.name);
      }
    }
  }

  const fs::path out(o.out_dir);
  const fs::path study_path = out / "study.jsonl";
  const std::string header = header_line(space, o, direction);
  std::vector<TrialRecord> records;
  if (fs::exists(study_path)) {
    std::ifstream f(study_path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(f, line);) lines.push_back(line);
    if (lines.empty()) throw UsageError(fmt::format("{}: empty study file (remove it to start afresh)", study_path.string()));
    Json h;
    try {
      h = JsonParser(lines[0]).parse();
    } catch (const std::exception& e) {
      throw UsageError(fmt::format("{}: line 1 is not a study header: {}", study_path.string(), e.what()));
    }
    const Json* fp = h.get("space");
    if (!fp || fp->string != space.fingerprint()) {
      throw UsageError(fmt::format("{}: the study was run on another search space\n  study file: {}\n  {}: {}",
                                   study_path.string(), fp ? fp->string : "(none)", o.space_path, space.fingerprint()));
    }
    for (const char* key : {"metric", "direction"}) {
      const Json* v = h.get(key);
      const std::string want = std::string(key) == "metric" ? o.metric : direction;
      if (!v || v->string != want) {
        throw UsageError(fmt::format("{}: the study's {} is \"{}\", this run's is \"{}\"", study_path.string(), key,
                                     v ? v->string : "", want));
      }
    }
    for (size_t i = 1; i < lines.size(); ++i) {
      if (lines[i].empty()) continue;
      const std::string where = fmt::format("{}:{}", study_path.string(), i + 1);
      try {
        auto r = parse_trial(JsonParser(lines[i]).parse(), space, where);
        r.trial.number = static_cast<int64_t>(records.size());
        records.push_back(std::move(r));
      } catch (const std::runtime_error& e) {
        if (i + 1 == lines.size()) {
          spdlog::warn("{}: ignoring a damaged last line (an interrupted write): {}", where, e.what());
          continue;
        }
        throw UsageError(fmt::format("{}: {}", where, e.what()));
      }
    }
    spdlog::info("tune: continuing the study in {} ({} finished trials)", out.string(), records.size());
  } else {
    fs::create_directories(out);
    train::write_file_atomic(study_path.string(), header);
  }

  std::shared_ptr<tune::Sampler> sampler;
  if (o.sampler == "random") {
    sampler = std::make_shared<tune::RandomSampler>();
  } else {
    sampler = std::make_shared<tune::GPSampler>();
  }
  std::shared_ptr<tune::Pruner> pruner;
  if (o.prune) pruner = std::make_shared<tune::MedianPruner>();
  tune::Study study(space, sampler, tune::StudyOptions().direction(direction).seed(o.seed), pruner);
  std::set<std::string> used_dirs;
  for (const auto& r : records) {
    study.add_trial(r.trial);
    used_dirs.insert(r.dir);
  }

  std::ofstream journal(study_path, std::ios::app);
  if (!journal) throw std::runtime_error(fmt::format("{}: cannot open for appending", study_path.string()));
  const std::string exe = o.executable.empty() ? fs::read_symlink("/proc/self/exe").string() : o.executable;
  fs::create_directories(out / "trials");
  std::map<pid_t, Running> running;
  auto launch = [&](const Trial& t) {
    std::string dir = fmt::format("trials/trial-{:04d}", t.number);
    for (char suffix = 'b'; used_dirs.count(dir); ++suffix) dir = fmt::format("trials/trial-{:04d}{}", t.number, suffix);
    used_dirs.insert(dir);
    fs::remove_all(out / dir);  // an unrecorded directory is what an interrupted run left behind
    fs::create_directories(out / dir);
    std::vector<std::string> args = {exe, "train", "--config", o.config_path, "--out", (out / dir).string()};
    for (const auto& s : o.overrides) args.insert(args.end(), {"--set", s});
    for (const auto& s : overrides_of(t.params)) args.insert(args.end(), {"--set", s});
    Running r{t, spawn(args, out / dir / "train.log"), dir, std::chrono::steady_clock::now()};
    std::string shown;
    for (const auto& s : overrides_of(t.params)) shown += " " + s;
    spdlog::info("tune: trial {} started:{}", t.number, shown);
    running.emplace(r.pid, std::move(r));
  };

  std::string config_failure;
  auto finished = [&] { return static_cast<int64_t>(records.size()); };
  while (true) {
    while (config_failure.empty() && static_cast<int64_t>(running.size()) < o.jobs &&
           finished() + static_cast<int64_t>(running.size()) < o.trials) {
      launch(study.ask());
    }
    if (running.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (auto it = running.begin(); it != running.end();) {
      Running& r = it->second;
      int status = 0;
      const pid_t done = waitpid(r.pid, &status, WNOHANG);
      if (done == 0) {
        if (pruner && !r.pruned) {
          for (const auto& [epoch, value] : val_history(out / r.dir, o.metric)) {
            if (study.trials()[static_cast<size_t>(r.trial.number)].intermediate.count(epoch)) continue;
            if (study.report(r.trial.number, epoch, value)) {
              spdlog::info("tune: trial {} pruned at epoch {} ({} {})", r.trial.number, epoch, o.metric, value);
              r.pruned = true;
              kill(r.pid, SIGTERM);
              break;
            }
          }
        }
        ++it;
        continue;
      }
      TrialRecord rec;
      rec.dir = r.dir;
      rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      for (const auto& [epoch, value] : val_history(out / r.dir, o.metric)) {
        if (!study.trials()[static_cast<size_t>(r.trial.number)].intermediate.count(epoch)) {
          study.report(r.trial.number, epoch, value);
        }
      }
      if (r.pruned) {
        study.prune(r.trial.number);
      } else if (code == 0) {
        double value = NAN;
        try {
          value = objective(out / r.dir, o.metric);
        } catch (const std::exception& e) {
          spdlog::warn("tune: trial {}: {}", r.trial.number, e.what());
        }
        if (std::isnan(value)) spdlog::warn("tune: trial {}: no finite {} in {}", r.trial.number, o.metric, r.dir);
        study.tell(r.trial.number, value);
      } else {
        const std::string log_path = (out / r.dir / "train.log").string();
        if (code == kExitUsage && config_failure.empty()) {
          config_failure = fmt::format("tune: trial {}: trainkit train rejected its configuration (exit code 2); "
                                       "see {}", r.trial.number, log_path);
        }
        spdlog::warn("tune: trial {} failed (exit code {}); see {}", r.trial.number, code, log_path);
        study.tell_failed(r.trial.number);
      }
      rec.trial = study.trials()[static_cast<size_t>(r.trial.number)];
      if (!(config_failure.size() && code == kExitUsage)) {
        journal << trial_line(rec);
        journal.flush();
        records.push_back(rec);
        spdlog::info("tune: trial {} {}: {} = {} ({:.1f} s); {} of {} finished", rec.trial.number,
                     tune::to_string(rec.trial.state), o.metric, rec.trial.value, rec.seconds, records.size(), o.trials);
        write_outputs(out, space, records, study.minimize(), o.metric);
      }
      it = running.erase(it);
    }
  }
  if (!config_failure.empty()) throw UsageError(config_failure);

  if (!records.empty()) write_outputs(out, space, records, study.minimize(), o.metric);
  TuneJobResult result;
  for (const auto& r : records) result.trials.push_back(r.trial);
  result.best = study.best_trial();
  if (result.best) {
    std::string shown;
    for (const auto& s : overrides_of(result.best->params)) shown += " --set " + s;
    spdlog::info("tune: best trial {}: {} = {}; {}/best.toml;{}", result.best->number, o.metric, result.best->value,
                 out.string(), shown);
  }
  return result;
}

}  // namespace trainkit::app
