#include "trainkit/sched/factory.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trainkit/sched/compose.h"
#include "trainkit/sched/cosine.h"
#include "trainkit/sched/cyclic.h"
#include "trainkit/sched/factor.h"
#include "trainkit/sched/plateau.h"

namespace trainkit::sched {
namespace {

/// Runs `f`; a std::invalid_argument from a scheduler's own checks becomes an ArgError prefixed with where
/// the table came from (unless it already names it).
template <class F>
auto located(const std::string& where, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const ArgError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    throw ArgError(msg.rfind(where, 0) == 0 ? msg : where + ": " + msg);
  }
}

int64_t run_length(const SchedulerContext& c, const std::string& interval) {
  return interval == "step" ? c.epochs * c.steps_per_epoch : c.epochs;
}

/// A maker that checks `options` now (parse time) and constructs Scheduler from them later.
template <class Scheduler, class Options>
SchedulerMaker checked(const ArgReader& args, Options options) {
  located(args.where(), [&] { Scheduler::validate(options); });
  return [options](torch::optim::Optimizer& opt, const SchedulerContext&) {
    return std::make_shared<Scheduler>(opt, options);
  };
}

struct Entry {
  std::string type;
  std::string default_interval;
  SchedulerReader reader;
};

SchedulerSpec parse_table(const ArgTable& table, const std::string& where, const std::string* outer_interval);

/// SequentialLR and ChainedScheduler: members are parsed now, with the outer table's interval.
SchedulerMaker read_composite(ArgReader& a, const std::string& interval, bool sequential) {
  std::vector<int64_t> milestones;
  std::vector<SchedulerSpec> members;
  for (ArgReader& sub : a.required_tables("schedulers")) {
    members.push_back(parse_table(sub.table(), sub.where(), &interval));
  }
  if (sequential) {
    milestones = a.required_integers("milestones");
    if (milestones.size() + 1 != members.size()) {
      a.fail("milestones", fmt::format("{} milestones (one fewer than the {} schedulers)", members.size() - 1,
                                       members.size()));
    }
  }
  const std::string where = a.where();
  return [members, milestones, sequential, where](torch::optim::Optimizer& opt, const SchedulerContext& context) {
    std::vector<std::shared_ptr<LRScheduler>> subs;
    for (const auto& m : members) {
      subs.push_back(located(m.where, [&] { return m.make(opt, context); }));
    }
    return located(where, [&]() -> std::shared_ptr<LRScheduler> {
      if (sequential) {
        return std::make_shared<SequentialLR>(opt, subs, milestones);
      }
      return std::make_shared<ChainedScheduler>(subs);
    });
  };
}

SchedulerMaker needs_code(ArgReader& a, const std::string& type) {
  a.fail(fmt::format("{} needs a C++ function (lr_lambda) and cannot be built from a config; construct "
                     "trainkit::sched::{} in code",
                     type, type));
}

/// Every built-in type, PyTorch's argument names; one entry per type.
std::vector<Entry> builtin_entries() {
  return {
      {"StepLR", "epoch",
       [](ArgReader& a, const std::string&) {
         StepLROptions o(a.required_integer("step_size"));
         if (auto v = a.number("gamma")) o.gamma(*v);
         return checked<StepLR>(a, o);
       }},
      {"MultiStepLR", "epoch",
       [](ArgReader& a, const std::string&) {
         MultiStepLROptions o(a.required_integers("milestones"));
         if (auto v = a.number("gamma")) o.gamma(*v);
         return checked<MultiStepLR>(a, o);
       }},
      {"ConstantLR", "epoch",
       [](ArgReader& a, const std::string&) {
         ConstantLROptions o;
         if (auto v = a.number("factor")) o.factor(*v);
         if (auto v = a.integer("total_iters")) o.total_iters(*v);
         return checked<ConstantLR>(a, o);
       }},
      {"LinearLR", "epoch",
       [](ArgReader& a, const std::string&) {
         LinearLROptions o;
         if (auto v = a.number("start_factor")) o.start_factor(*v);
         if (auto v = a.number("end_factor")) o.end_factor(*v);
         if (auto v = a.integer("total_iters")) o.total_iters(*v);
         return checked<LinearLR>(a, o);
       }},
      {"ExponentialLR", "epoch",
       [](ArgReader& a, const std::string&) {
         return checked<ExponentialLR>(a, ExponentialLROptions(a.required_number("gamma")));
       }},
      {"PolynomialLR", "epoch",
       [](ArgReader& a, const std::string&) {
         PolynomialLROptions o;
         if (auto v = a.integer("total_iters")) o.total_iters(*v);
         if (auto v = a.number("power")) o.power(*v);
         return checked<PolynomialLR>(a, o);
       }},
      {"CosineAnnealingLR", "epoch",
       [](ArgReader& a, const std::string&) {
         CosineAnnealingLROptions o(a.required_integer("T_max"));
         if (auto v = a.number("eta_min")) o.eta_min(*v);
         return checked<CosineAnnealingLR>(a, o);
       }},
      {"CosineAnnealingWarmRestarts", "epoch",
       [](ArgReader& a, const std::string&) {
         CosineAnnealingWarmRestartsOptions o(a.required_integer("T_0"));
         if (auto v = a.integer("T_mult")) o.T_mult(*v);
         if (auto v = a.number("eta_min")) o.eta_min(*v);
         return checked<CosineAnnealingWarmRestarts>(a, o);
       }},
      {"WarmupCosine", "step",
       [](ArgReader& a, const std::string& interval) -> SchedulerMaker {
         const int64_t warmup = a.required_integer("warmup_steps");
         const auto total = a.integer("total_steps");
         WarmupCosineOptions o(warmup, total.value_or(warmup + 1));
         if (auto v = a.number("warmup_start_factor")) o.warmup_start_factor(*v);
         if (auto v = a.number("eta_min")) o.eta_min(*v);
         located(a.where(), [&] { WarmupCosine::validate(o); });
         const std::string where = a.where();
         return [o, total, interval, where](torch::optim::Optimizer& opt, const SchedulerContext& context) {
           WarmupCosineOptions run = o;
           if (!total) {
             const int64_t length = run_length(context, interval);
             if (length == 0) {
               throw ArgError(where + ": total_steps is required (the run length is unknown here)");
             }
             run.total_steps(length);
           }
           return located(where, [&] { return std::make_shared<WarmupCosine>(opt, run); });
         };
       }},
      {"CyclicLR", "step",
       [](ArgReader& a, const std::string&) {
         CyclicLROptions o(a.required_numbers("base_lr"), a.required_numbers("max_lr"));
         if (auto v = a.integer("step_size_up")) o.step_size_up(*v);
         if (auto v = a.integer("step_size_down")) o.step_size_down(*v);
         if (auto v = a.string("mode")) o.mode(*v);
         if (auto v = a.number("gamma")) o.gamma(*v);
         if (auto v = a.boolean("cycle_momentum")) o.cycle_momentum(*v);
         if (auto v = a.numbers("base_momentum")) o.base_momentum(*v);
         if (auto v = a.numbers("max_momentum")) o.max_momentum(*v);
         return checked<CyclicLR>(a, o);
       }},
      {"OneCycleLR", "step",
       [](ArgReader& a, const std::string& interval) -> SchedulerMaker {
         OneCycleLROptions o(a.required_numbers("max_lr"));
         const auto total = a.integer("total_steps");
         const auto epochs = a.integer("epochs");
         const auto spe = a.integer("steps_per_epoch");
         if (total) {
           o.total_steps(*total);
         } else if (epochs || spe) {
           o.epochs(epochs.value_or(0)).steps_per_epoch(spe.value_or(0));
         }
         if (auto v = a.number("pct_start")) o.pct_start(*v);
         if (auto v = a.string("anneal_strategy")) o.anneal_strategy(*v);
         if (auto v = a.boolean("cycle_momentum")) o.cycle_momentum(*v);
         if (auto v = a.numbers("base_momentum")) o.base_momentum(*v);
         if (auto v = a.numbers("max_momentum")) o.max_momentum(*v);
         if (auto v = a.number("div_factor")) o.div_factor(*v);
         if (auto v = a.number("final_div_factor")) o.final_div_factor(*v);
         if (auto v = a.boolean("three_phase")) o.three_phase(*v);
         located(a.where(), [&] { OneCycleLR::validate(o); });
         const bool from_run = !total && !epochs && !spe;
         const std::string where = a.where();
         return [o, from_run, interval, where](torch::optim::Optimizer& opt, const SchedulerContext& context) {
           OneCycleLROptions run = o;
           if (from_run) {
             run.total_steps(run_length(context, interval));
           }
           return located(where, [&] { return std::make_shared<OneCycleLR>(opt, run); });
         };
       }},
      {"ReduceLROnPlateau", "epoch",
       [](ArgReader& a, const std::string& interval) {
         if (interval != "epoch") {
           a.fail("ReduceLROnPlateau steps once per epoch on the validation loss; interval must be \"epoch\"");
         }
         ReduceLROnPlateauOptions o;
         if (auto v = a.string("mode")) o.mode(*v);
         if (auto v = a.number("factor")) o.factor(*v);
         if (auto v = a.integer("patience")) o.patience(*v);
         if (auto v = a.number("threshold")) o.threshold(*v);
         if (auto v = a.string("threshold_mode")) o.threshold_mode(*v);
         if (auto v = a.integer("cooldown")) o.cooldown(*v);
         if (auto v = a.numbers("min_lr")) o.min_lr(*v);
         if (auto v = a.number("eps")) o.eps(*v);
         return checked<ReduceLROnPlateau>(a, o);
       }},
      {"SequentialLR", "epoch",
       [](ArgReader& a, const std::string& interval) { return read_composite(a, interval, true); }},
      {"ChainedScheduler", "epoch",
       [](ArgReader& a, const std::string& interval) { return read_composite(a, interval, false); }},
  };
}

struct Registry {
  std::mutex mutex;
  std::vector<Entry> entries = builtin_entries();
};

Registry& registry() {
  static Registry r;
  return r;
}

Entry find_entry(ArgReader& a) {
  const auto type = a.string("type");
  if (!type) {
    a.fail(fmt::format("type is required (one of {})", fmt::join(scheduler_types(), ", ")));
  }
  if (*type == "LambdaLR" || *type == "MultiplicativeLR") {
    needs_code(a, *type);
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

void register_scheduler(const std::string& type, const std::string& default_interval, SchedulerReader reader) {
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
    *it = Entry{type, default_interval, std::move(reader)};
  } else {
    r.entries.push_back(Entry{type, default_interval, std::move(reader)});
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

}  // namespace trainkit::sched
