#pragma once
/// @file
/// Builds schedulers from named arguments whose keys are PyTorch's argument names, e.g.
/// `type = "CosineAnnealingLR"`, `T_max = 100`, `eta_min = 1e-5`; SequentialLR and ChainedScheduler take
/// their members as an array of tables `schedulers`. Two steps: parse_scheduler() reads and checks every
/// key, type and value without an optimizer (so a bad table fails before any work starts), and
/// make_scheduler() builds the parsed scheduler for an optimizer once the run's length is known.
/// Each scheduler registers its reader from its own source (the built-ins: see the registration line in
/// each header); register_scheduler() adds a user's own.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainkit/args.h"
#include "trainkit/options.h"
#include "trainkit/sched/scheduler.h"

namespace trainkit::sched {

/// What the caller knows about the run, used for defaults (the length of OneCycleLR, WarmupCosine and
/// WarmupStableDecay).
struct SchedulerContext {
  int64_t epochs = 0;           ///< epochs of the run (0 = unknown)
  int64_t steps_per_epoch = 0;  ///< optimizer steps per epoch (0 = unknown)
};

/// Builds one parsed scheduler for an optimizer; `interval` is the spec's.
using SchedulerMaker = std::function<std::shared_ptr<LRScheduler>(torch::optim::Optimizer& optimizer,
                                                                   const SchedulerContext& context)>;

/// A scheduler table, read and checked: keys, types and value ranges (each scheduler's `validate`).
struct SchedulerSpec {
  std::string type;      ///< PyTorch's class name, e.g. "CosineAnnealingLR"
  /// "step" (after every optimizer step) or "epoch" (after every epoch); key `interval`, defaulting to
  /// "step" for CyclicLR, OneCycleLR, WarmupCosine, WarmupStableDecay and InverseSqrt and "epoch" for the others.
  std::string interval;
  std::string where;     ///< where the table came from, for errors found when building
  SchedulerMaker make;   ///< builds it (options already read)
};

/// A scheduler built from a spec, and when to step it.
struct BuiltScheduler {
  std::shared_ptr<LRScheduler> scheduler;
  std::string interval;  ///< "step" or "epoch"
};

/// Reads and checks a scheduler table; `where` names it in errors (e.g. "train.toml: [scheduler]").
/// Unknown types or keys, wrong types, missing or invalid values throw ArgError naming `where` and the key.
SchedulerSpec parse_scheduler(const ArgTable& table, const std::string& where);

/// Reads a member table of a composite (SequentialLR, ChainedScheduler): it takes the outer table's
/// `interval` and may not set its own.
SchedulerSpec parse_member_scheduler(const ArgTable& table, const std::string& where, const std::string& interval);

/// Builds `spec` for `optimizer`. OneCycleLR and WarmupCosine without total_steps, and WarmupStableDecay
/// without num_training_steps or num_stable_steps, run for the whole run (`context`), counted in the
/// scheduler's interval. Problems that need the optimizer or the run length
/// (values per param group, a missing momentum, an unknown length) throw ArgError naming spec.where.
BuiltScheduler make_scheduler(const SchedulerSpec& spec, torch::optim::Optimizer& optimizer,
                              const SchedulerContext& context = {});

/// How one scheduler type reads its arguments: it reads every key it knows from `args` (the caller rejects
/// the rest) and returns the maker. `interval` is the resolved interval of the outer table.
using SchedulerReader = std::function<SchedulerMaker(ArgReader& args, const std::string& interval)>;

/// Runs `check` (e.g. a scheduler's validate); its std::invalid_argument becomes an ArgError prefixed with
/// `where` (unless it already starts with it).
void check_at(const std::string& where, const std::function<void()>& check);

/// The usual reader's result: `options` checked now with Scheduler::validate (errors named by
/// args.where()), the scheduler constructed from them when built.
template <class Scheduler, class Options>
SchedulerMaker validated_maker(const ArgReader& args, Options options) {
  check_at(args.where(), [&options] { Scheduler::validate(options); });
  return [options](torch::optim::Optimizer& optimizer, const SchedulerContext&) {
    return std::make_shared<Scheduler>(optimizer, options);
  };
}

/// One key of a scheduler type, for docs (docs/config.md).
struct SchedulerArgDoc {
  std::string key;            ///< PyTorch's argument name ("T_max")
  std::string type;           ///< type and range as text ("integer >= 1")
  std::string default_value;  ///< the default as TOML text, or "required", "the run"
  std::string doc;            ///< meaning, one line
};

/// The docs of every key of `binding`, with the defaults of `defaults` (or the field's default_text).
template <class Options>
std::vector<SchedulerArgDoc> scheduler_arg_docs(const OptionBinding<Options>& binding, const Options& defaults) {
  std::vector<SchedulerArgDoc> out;
  for (const auto& field : binding.fields()) {
    std::string value = field.default_text;
    if (value.empty()) {
      const auto shown = field.show(defaults);
      value = shown ? "`" + shown->to_string() + "`" : "unset";
    }
    out.push_back({field.key, field.type, value, field.doc});
  }
  return out;
}

/// Registers a scheduler type for parse_scheduler (e.g. a user's own). `default_interval` is "step" or
/// "epoch"; `docs` lists its keys for docs/config.md. Replaces an existing entry of the same type.
void register_scheduler(const std::string& type, const std::string& default_interval, SchedulerReader reader,
                        std::vector<SchedulerArgDoc> docs = {});

/// Registers `type` read through Options::binding() (every key, rule and required key named once, in the
/// Options struct): the table's keys over `defaults` (whose required fields are placeholders the table
/// replaces), checked with Scheduler::validate.
template <class Scheduler, class Options>
void register_bound_scheduler(const std::string& type, const std::string& default_interval, const Options& defaults) {
  register_scheduler(
      type, default_interval,
      [defaults](ArgReader& args, const std::string&) {
        Options o = defaults;
        read_options(Options::binding(), args, o);
        return validated_maker<Scheduler>(args, o);
      },
      scheduler_arg_docs(Options::binding(), defaults));
}

/// The `type` names parse_scheduler accepts, sorted.
std::vector<std::string> scheduler_types();

/// The keys of scheduler `type` as registered (empty for an unknown type or one registered without docs).
std::vector<SchedulerArgDoc> scheduler_arg_docs(const std::string& type);

/// Optimizer steps (interval "step") or epochs of the whole run, as `context` knows them (0 = unknown).
int64_t run_length(const SchedulerContext& context, const std::string& interval);

/// run_length() for a scheduler whose `key` defaults to the run; throws ArgError("<where>: <key> is required
/// (the run length is unknown here)") when `context` does not know it.
int64_t required_run_length(const SchedulerContext& context, const std::string& interval, const std::string& where,
                            const std::string& key);

}  // namespace trainkit::sched
