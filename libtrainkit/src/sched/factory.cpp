#include "trainkit/sched/factory.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

// The built-in schedulers register themselves from their own sources; including their headers here links
// those sources into every program that uses the factory (see the registration line in each header).
#include "trainkit/sched.h"

namespace trainkit::sched {
namespace {

/// Runs `f`; a std::invalid_argument from a scheduler's own checks becomes an ArgError prefixed with where
/// the table came from (unless it already names it).
template <class F>
auto located(const std::string& where, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const ArgError&) {
    throw;  // keeps its key
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    throw ArgError(msg.rfind(where, 0) == 0 ? msg : where + ": " + msg);
  }
}

struct Entry {
  std::string type;
  std::string default_interval;
  SchedulerReader reader;
  std::vector<SchedulerArgDoc> docs;
};

struct Registry {
  std::mutex mutex;
  std::vector<Entry> entries;  // sorted by type: registration order depends on static initialization
};

Registry& registry() {
  // Never destroyed: a factory may be called from a static object's destructor, after main() returns.
  static auto* r = new Registry;  // NOLINT(cppcoreguidelines-owning-memory)
  return *r;
}

Entry find_entry(ArgReader& a) {
  const auto type = a.string("type");
  if (!type) {
    a.fail(fmt::format("type is required (one of {})", fmt::join(scheduler_types(), ", ")));
  }
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = std::find_if(r.entries.begin(), r.entries.end(), [&](const Entry& e) { return e.type == *type; });
  if (it == r.entries.end()) {
    std::vector<std::string> names;
    for (const auto& e : r.entries) {
      names.push_back(e.type);
    }
    a.fail(fmt::format("unknown type \"{}\" (one of {})", *type, fmt::join(names, ", ")));
  }
  return *it;
}

/// One table: the outer one (outer_interval null: reads `interval`) or a member of a composite.
SchedulerSpec parse_table(const ArgTable& table, const std::string& where, const std::string* outer_interval) {
  ArgReader a(table, where);
  const Entry entry = find_entry(a);
  SchedulerSpec spec;
  spec.type = entry.type;
  spec.where = where;
  if (outer_interval == nullptr) {
    spec.interval = a.string("interval").value_or(entry.default_interval);
    if (spec.interval != "step" && spec.interval != "epoch") {
      a.fail("interval", "\"step\" or \"epoch\"");
    }
  } else {
    if (a.has("interval")) {
      a.fail("interval belongs to the outer scheduler");
    }
    spec.interval = *outer_interval;
  }
  spec.make = entry.reader(a, spec.interval);
  a.finish(entry.type);
  return spec;
}

}  // namespace

SchedulerSpec parse_scheduler(const ArgTable& table, const std::string& where) {
  return parse_table(table, where, nullptr);
}

SchedulerSpec parse_member_scheduler(const ArgTable& table, const std::string& where, const std::string& interval) {
  return parse_table(table, where, &interval);
}

void check_at(const std::string& where, const std::function<void()>& check) { located(where, check); }

int64_t run_length(const SchedulerContext& context, const std::string& interval) {
  return interval == "step" ? context.epochs * context.steps_per_epoch : context.epochs;
}

int64_t required_run_length(const SchedulerContext& context, const std::string& interval, const std::string& where,
                            const std::string& key) {
  const int64_t length = run_length(context, interval);
  if (length == 0) {
    throw ArgError(where + ": " + key + " is required (the run length is unknown here)");
  }
  return length;
}

BuiltScheduler make_scheduler(const SchedulerSpec& spec, torch::optim::Optimizer& optimizer,
                              const SchedulerContext& context) {
  if (!spec.make) {
    throw std::invalid_argument("make_scheduler: the spec was not made by parse_scheduler");
  }
  BuiltScheduler out;
  out.interval = spec.interval;
  out.scheduler = located(spec.where, [&] { return spec.make(optimizer, context); });
  return out;
}

void register_scheduler(const std::string& type, const std::string& default_interval, SchedulerReader reader,
                        std::vector<SchedulerArgDoc> docs) {
  if (type.empty() || !reader) {
    throw std::invalid_argument("register_scheduler: a type name and a reader are required");
  }
  if (default_interval != "step" && default_interval != "epoch") {
    throw std::invalid_argument(fmt::format("register_scheduler({}): default_interval must be \"step\" or \"epoch\", "
                                            "got \"{}\"",
                                            type, default_interval));
  }
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = std::find_if(r.entries.begin(), r.entries.end(), [&](const Entry& e) { return e.type == type; });
  if (it != r.entries.end()) {
    *it = Entry{type, default_interval, std::move(reader), std::move(docs)};
  } else {
    const auto at = std::lower_bound(r.entries.begin(), r.entries.end(), type,
                                     [](const Entry& e, const std::string& t) { return e.type < t; });
    r.entries.insert(at, Entry{type, default_interval, std::move(reader), std::move(docs)});
  }
}

std::vector<std::string> scheduler_types() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& e : r.entries) {
    out.push_back(e.type);
  }
  return out;
}

std::vector<SchedulerArgDoc> scheduler_arg_docs(const std::string& type) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = std::find_if(r.entries.begin(), r.entries.end(), [&](const Entry& e) { return e.type == type; });
  return it == r.entries.end() ? std::vector<SchedulerArgDoc>{} : it->docs;
}

}  // namespace trainkit::sched
