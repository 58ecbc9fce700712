#include "trainkit/sched/factory.h"

#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include <set>
#include <sstream>
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

/// Reads the keys of one scheduler table, remembering which were used so that the rest can be rejected.
class Args {
 public:
  Args(const toml::table& table, std::string where) : table_(table), where_(std::move(where)) {}

  const std::string& where() const { return where_; }
  bool has(const std::string& key) const { return table_.contains(key); }

  std::optional<int64_t> int_(const std::string& key) {
    const auto* node = use(key);
    if (node == nullptr) {
      return std::nullopt;
    }
    if (const auto* v = node->as_integer()) {
      return v->get();
    }
    fail(key, "an integer", *node);
  }
  int64_t required_int(const std::string& key) {
    auto v = int_(key);
    if (!v) {
      missing(key);
    }
    return *v;
  }
  std::optional<double> num(const std::string& key) {
    const auto* node = use(key);
    if (node == nullptr) {
      return std::nullopt;
    }
    if (const auto* f = node->as_floating_point()) {
      return f->get();
    }
    if (const auto* i = node->as_integer()) {
      return static_cast<double>(i->get());
    }
    fail(key, "a number", *node);
  }
  double required_num(const std::string& key) {
    auto v = num(key);
    if (!v) {
      missing(key);
    }
    return *v;
  }
  std::optional<bool> boolean(const std::string& key) {
    const auto* node = use(key);
    if (node == nullptr) {
      return std::nullopt;
    }
    if (const auto* b = node->as_boolean()) {
      return b->get();
    }
    fail(key, "true or false", *node);
  }
  std::optional<std::string> str(const std::string& key) {
    const auto* node = use(key);
    if (node == nullptr) {
      return std::nullopt;
    }
    if (const auto* s = node->as_string()) {
      return s->get();
    }
    fail(key, "a string", *node);
  }
  /// A number, or an array of numbers (one per param group).
  std::optional<std::vector<double>> nums(const std::string& key) {
    const auto* node = use(key);
    if (node == nullptr) {
      return std::nullopt;
    }
    if (node->is_number()) {
      return std::vector<double>{node->value<double>().value()};
    }
    std::vector<double> out;
    if (const auto* a = node->as_array()) {
      for (const auto& e : *a) {
        if (!e.is_number()) {
          fail(key, "a number or an array of numbers", *node);
        }
        out.push_back(e.value<double>().value());
      }
      if (!out.empty()) {
        return out;
      }
    }
    fail(key, "a number or an array of numbers", *node);
  }
  std::vector<double> required_nums(const std::string& key) {
    auto v = nums(key);
    if (!v) {
      missing(key);
    }
    return *v;
  }
  std::vector<int64_t> required_ints(const std::string& key) {
    const auto* node = use(key);
    if (node == nullptr) {
      missing(key);
    }
    std::vector<int64_t> out;
    const auto* a = node->as_array();
    if (a == nullptr) {
      fail(key, "an array of integers", *node);
    }
    for (const auto& e : *a) {
      if (!e.is_integer()) {
        fail(key, "an array of integers", *node);
      }
      out.push_back(e.as_integer()->get());
    }
    return out;
  }
  const toml::array& required_tables(const std::string& key) {
    const auto* node = use(key);
    if (node == nullptr) {
      missing(key);
    }
    const auto* a = node->as_array();
    if (a == nullptr || a->empty() || !a->is_array_of_tables()) {
      fail(key, "a non-empty array of tables ([[schedulers]])", *node);
    }
    return *a;
  }
  /// Rejects every key that was not read.
  void finish(const std::string& type) const {
    for (const auto& [k, v] : table_) {
      const std::string key(k.str());
      if (used_.count(key) == 0) {
        throw std::invalid_argument(fmt::format("{}: unknown key '{}' for {} (known: {})", where_, key, type,
                                                fmt::join(used_, ", ")));
      }
    }
  }

 private:
  const toml::node* use(const std::string& key) {
    used_.insert(key);
    return table_.get(key);
  }
  [[noreturn]] void fail(const std::string& key, const std::string& expected, const toml::node& node) const {
    std::ostringstream got;
    node.visit([&got](const auto& v) { got << v; });
    throw std::invalid_argument(fmt::format("{}: {}: expected {}, got {}", where_, key, expected, got.str()));
  }
  [[noreturn]] void missing(const std::string& key) const {
    throw std::invalid_argument(fmt::format("{}: {} is required", where_, key));
  }

  const toml::table& table_;
  std::string where_;
  std::set<std::string> used_;  // keys read so far: the known keys of this type
};

/// Prefixes an error from a scheduler's constructor with where its table came from.
template <class F>
auto located(const std::string& where, F make) -> decltype(make()) {
  try {
    return make();
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    if (msg.rfind(where, 0) == 0) {
      throw;
    }
    throw std::invalid_argument(where + ": " + msg);
  }
}

std::string default_interval(const std::string& type) {
  return (type == "CyclicLR" || type == "OneCycleLR" || type == "WarmupCosine") ? "step" : "epoch";
}

int64_t run_length(const SchedulerContext& c, const std::string& interval) {
  return interval == "step" ? c.epochs * c.steps_per_epoch : c.epochs;
}

std::shared_ptr<LRScheduler> build(const toml::table& table, torch::optim::Optimizer& opt, const std::string& where,
                                   const SchedulerContext& context, const std::string& interval) {
  Args a(table, where);
  const auto type_opt = a.str("type");
  if (!type_opt) {
    throw std::invalid_argument(fmt::format("{}: type is required (one of {})", where,
                                            fmt::join(scheduler_types(), ", ")));
  }
  const std::string type = *type_opt;
  std::shared_ptr<LRScheduler> s;
  if (type == "StepLR") {
    StepLROptions o(a.required_int("step_size"));
    if (auto v = a.num("gamma")) o.gamma(*v);
    s = located(where, [&] { return std::make_shared<StepLR>(opt, o); });
  } else if (type == "MultiStepLR") {
    MultiStepLROptions o(a.required_ints("milestones"));
    if (auto v = a.num("gamma")) o.gamma(*v);
    s = located(where, [&] { return std::make_shared<MultiStepLR>(opt, o); });
  } else if (type == "ConstantLR") {
    ConstantLROptions o;
    if (auto v = a.num("factor")) o.factor(*v);
    if (auto v = a.int_("total_iters")) o.total_iters(*v);
    s = located(where, [&] { return std::make_shared<ConstantLR>(opt, o); });
  } else if (type == "LinearLR") {
    LinearLROptions o;
    if (auto v = a.num("start_factor")) o.start_factor(*v);
    if (auto v = a.num("end_factor")) o.end_factor(*v);
    if (auto v = a.int_("total_iters")) o.total_iters(*v);
    s = located(where, [&] { return std::make_shared<LinearLR>(opt, o); });
  } else if (type == "ExponentialLR") {
    ExponentialLROptions o(a.required_num("gamma"));
    s = located(where, [&] { return std::make_shared<ExponentialLR>(opt, o); });
  } else if (type == "PolynomialLR") {
    PolynomialLROptions o;
    if (auto v = a.int_("total_iters")) o.total_iters(*v);
    if (auto v = a.num("power")) o.power(*v);
    s = located(where, [&] { return std::make_shared<PolynomialLR>(opt, o); });
  } else if (type == "CosineAnnealingLR") {
    CosineAnnealingLROptions o(a.required_int("T_max"));
    if (auto v = a.num("eta_min")) o.eta_min(*v);
    s = located(where, [&] { return std::make_shared<CosineAnnealingLR>(opt, o); });
  } else if (type == "CosineAnnealingWarmRestarts") {
    CosineAnnealingWarmRestartsOptions o(a.required_int("T_0"));
    if (auto v = a.int_("T_mult")) o.T_mult(*v);
    if (auto v = a.num("eta_min")) o.eta_min(*v);
    s = located(where, [&] { return std::make_shared<CosineAnnealingWarmRestarts>(opt, o); });
  } else if (type == "WarmupCosine") {
    const int64_t warmup = a.required_int("warmup_steps");
    int64_t total = a.int_("total_steps").value_or(run_length(context, interval));
    if (total == 0) {
      throw std::invalid_argument(fmt::format("{}: total_steps is required (the run length is unknown here)", where));
    }
    WarmupCosineOptions o(warmup, total);
    if (auto v = a.num("warmup_start_factor")) o.warmup_start_factor(*v);
    if (auto v = a.num("eta_min")) o.eta_min(*v);
    s = located(where, [&] { return std::make_shared<WarmupCosine>(opt, o); });
  } else if (type == "CyclicLR") {
    CyclicLROptions o(a.required_nums("base_lr"), a.required_nums("max_lr"));
    if (auto v = a.int_("step_size_up")) o.step_size_up(*v);
    if (auto v = a.int_("step_size_down")) o.step_size_down(*v);
    if (auto v = a.str("mode")) o.mode(*v);
    if (auto v = a.num("gamma")) o.gamma(*v);
    if (auto v = a.boolean("cycle_momentum")) o.cycle_momentum(*v);
    if (auto v = a.nums("base_momentum")) o.base_momentum(*v);
    if (auto v = a.nums("max_momentum")) o.max_momentum(*v);
    s = located(where, [&] { return std::make_shared<CyclicLR>(opt, o); });
  } else if (type == "OneCycleLR") {
    OneCycleLROptions o(a.required_nums("max_lr"));
    const auto total = a.int_("total_steps");
    const auto epochs = a.int_("epochs");
    const auto spe = a.int_("steps_per_epoch");
    if (total) {
      o.total_steps(*total);
    } else if (epochs || spe) {
      o.epochs(epochs.value_or(0)).steps_per_epoch(spe.value_or(0));
    } else {
      o.total_steps(run_length(context, interval));
    }
    if (auto v = a.num("pct_start")) o.pct_start(*v);
    if (auto v = a.str("anneal_strategy")) o.anneal_strategy(*v);
    if (auto v = a.boolean("cycle_momentum")) o.cycle_momentum(*v);
    if (auto v = a.nums("base_momentum")) o.base_momentum(*v);
    if (auto v = a.nums("max_momentum")) o.max_momentum(*v);
    if (auto v = a.num("div_factor")) o.div_factor(*v);
    if (auto v = a.num("final_div_factor")) o.final_div_factor(*v);
    if (auto v = a.boolean("three_phase")) o.three_phase(*v);
    s = located(where, [&] { return std::make_shared<OneCycleLR>(opt, o); });
  } else if (type == "ReduceLROnPlateau") {
    ReduceLROnPlateauOptions o;
    if (auto v = a.str("mode")) o.mode(*v);
    if (auto v = a.num("factor")) o.factor(*v);
    if (auto v = a.int_("patience")) o.patience(*v);
    if (auto v = a.num("threshold")) o.threshold(*v);
    if (auto v = a.str("threshold_mode")) o.threshold_mode(*v);
    if (auto v = a.int_("cooldown")) o.cooldown(*v);
    if (auto v = a.nums("min_lr")) o.min_lr(*v);
    if (auto v = a.num("eps")) o.eps(*v);
    s = located(where, [&] { return std::make_shared<ReduceLROnPlateau>(opt, o); });
  } else if (type == "SequentialLR" || type == "ChainedScheduler") {
    const toml::array& members = a.required_tables("schedulers");
    std::vector<int64_t> milestones;
    if (type == "SequentialLR") {
      milestones = a.required_ints("milestones");
    }
    std::vector<std::shared_ptr<LRScheduler>> subs;
    for (size_t i = 0; i < members.size(); ++i) {
      const auto& sub = *members.get(i)->as_table();
      const std::string sub_where = fmt::format("{}.schedulers[{}]", where, i);
      if (sub.contains("interval")) {
        throw std::invalid_argument(sub_where + ": interval belongs to the outer scheduler");
      }
      subs.push_back(build(sub, opt, sub_where, context, interval));
    }
    if (type == "SequentialLR") {
      s = located(where, [&] { return std::make_shared<SequentialLR>(opt, subs, milestones); });
    } else {
      s = located(where, [&] { return std::make_shared<ChainedScheduler>(subs); });
    }
  } else if (type == "LambdaLR" || type == "MultiplicativeLR") {
    throw std::invalid_argument(fmt::format("{}: {} needs a C++ function (lr_lambda) and cannot be built from a "
                                            "config; construct trainkit::sched::{} in code",
                                            where, type, type));
  } else {
    throw std::invalid_argument(fmt::format("{}: unknown type \"{}\" (one of {})", where, type,
                                            fmt::join(scheduler_types(), ", ")));
  }
  if (where.find(".schedulers[") == std::string::npos) {
    a.str("interval");  // read by make_scheduler; mark as known here
  }
  a.finish(type);
  return s;
}

}  // namespace

std::vector<std::string> scheduler_types() {
  return {"StepLR",          "MultiStepLR",  "ConstantLR",        "LinearLR",
          "ExponentialLR",   "PolynomialLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts",
          "WarmupCosine",    "CyclicLR",     "OneCycleLR",        "ReduceLROnPlateau",
          "SequentialLR",    "ChainedScheduler"};
}

BuiltScheduler make_scheduler(const std::string& toml_text, torch::optim::Optimizer& optimizer,
                              const std::string& source, const SchedulerContext& context) {
  toml::table table;
  try {
    table = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    throw std::invalid_argument(fmt::format("{}: TOML syntax error at line {}: {}", source, e.source().begin.line,
                                            e.description()));
  }
  BuiltScheduler out;
  const std::string type = table["type"].value_or(std::string());
  out.interval = table["interval"].value_or(default_interval(type));
  if (const auto* node = table.get("interval"); node != nullptr && !node->is_string()) {
    throw std::invalid_argument(source + ": interval: expected \"step\" or \"epoch\"");
  }
  if (out.interval != "step" && out.interval != "epoch") {
    throw std::invalid_argument(fmt::format("{}: interval: expected \"step\" or \"epoch\", got \"{}\"", source,
                                            out.interval));
  }
  if (type == "ReduceLROnPlateau" && out.interval != "epoch") {
    throw std::invalid_argument(source + ": ReduceLROnPlateau steps once per epoch on the validation loss; "
                                         "interval must be \"epoch\"");
  }
  out.scheduler = build(table, optimizer, source, context, out.interval);
  return out;
}

}  // namespace trainkit::sched
