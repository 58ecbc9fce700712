// LR schedulers against Python PyTorch's torch.optim.lr_scheduler (tests/golden/schedulers.toml): every
// step's LR of two param groups, and the cycled momentum / beta1, to 1e-12 relative; a mid-run
// save → load into fresh objects continues the same trace; bad arguments are named.
#include <cmath>
#include <map>
#include <sstream>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/app/toml_args.h"
#include "trainkit/sched.h"
#include "trainkit/sched/factory.h"

using namespace trainkit::sched;
using Catch::Matchers::Contains;

namespace {

/// The factory's two steps on a TOML table (as the application layer runs them).
BuiltScheduler make_scheduler(const std::string& toml_text, torch::optim::Optimizer& opt, const std::string& where,
                              const SchedulerContext& context = {}) {
  return trainkit::sched::make_scheduler(parse_scheduler(trainkit::app::parse_toml(toml_text, where), where), opt,
                                         context);
}

SchedulerSpec parse(const std::string& toml_text) {
  return parse_scheduler(trainkit::app::parse_toml(toml_text, "cfg.toml"), "cfg.toml");
}

struct Setup {
  at::Tensor p0 = torch::zeros({3}, torch::kFloat64).requires_grad_();
  at::Tensor p1 = torch::zeros({2}, torch::kFloat64).requires_grad_();
  std::unique_ptr<torch::optim::Optimizer> opt;

  explicit Setup(const std::string& kind) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (kind == "sgd") {
      groups.emplace_back(std::vector<at::Tensor>{p0}, std::make_unique<torch::optim::SGDOptions>(
                                                           torch::optim::SGDOptions(0.1).momentum(0.9)));
      groups.emplace_back(std::vector<at::Tensor>{p1}, std::make_unique<torch::optim::SGDOptions>(
                                                           torch::optim::SGDOptions(0.01).momentum(0.9)));
      opt = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(0.1).momentum(0.9));
    } else {
      groups.emplace_back(std::vector<at::Tensor>{p0},
                          std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(0.1)));
      groups.emplace_back(std::vector<at::Tensor>{p1},
                          std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(0.01)));
      opt = std::make_unique<torch::optim::Adam>(groups, torch::optim::AdamOptions(0.1));
    }
  }
};

bool close(double got, double want) {
  return std::abs(got - want) <= 1e-12 * std::max(std::abs(got), std::abs(want)) + 1e-15;
}

std::vector<double> column(const toml::array& per_group, size_t g) {
  std::vector<double> out;
  for (const auto& v : *per_group.get(g)->as_array()) {
    out.push_back(v.value<double>().value());
  }
  return out;
}

/// Steps `s` from step `from` to `to` (recording after each), comparing with the golden columns.
void check_steps(LRScheduler& s, torch::optim::Optimizer& opt, const toml::table& c, int64_t from, int64_t to) {
  const auto& lr = *c["lr"].as_array();
  const auto* momentum = c["momentum"].as_array();
  const auto* metrics = c["metrics"].as_array();
  for (int64_t i = from; i <= to; ++i) {
    if (i > 0) {
      if (metrics != nullptr) {
        s.step(metrics->get(static_cast<size_t>(i - 1))->value<double>().value());
      } else {
        s.step();
      }
    }
    for (size_t g = 0; g < 2; ++g) {
      const double want = column(lr, g)[static_cast<size_t>(i)];
      const double got = opt.param_groups()[g].options().get_lr();
      INFO("step " << i << " group " << g);
      REQUIRE(close(got, want));
      REQUIRE(s.get_last_lr()[g] == got);
      if (momentum != nullptr) {
        REQUIRE(close(get_cyclable_momentum(opt.param_groups()[g]), column(*momentum, g)[static_cast<size_t>(i)]));
      }
    }
  }
}

}  // namespace

TEST_CASE("schedulers match PyTorch's traces step by step", "[sched][golden]") {
  const auto& golden = trainkit::test::golden("schedulers.toml");
  for (const auto& node : *golden["case"].as_array()) {
    const auto& c = *node.as_table();
    const std::string name = c["name"].value<std::string>().value();
    const std::string config = c["config"].value<std::string>().value();
    const int64_t steps = c["steps"].value<int64_t>().value();
    DYNAMIC_SECTION(name) {
      Setup setup(c["optimizer"].value<std::string>().value());
      auto built = make_scheduler(config, *setup.opt, name);
      INFO(config);
      check_steps(*built.scheduler, *setup.opt, c, 0, steps);
    }
  }
}

TEST_CASE("LambdaLR and MultiplicativeLR match PyTorch with the same functions", "[sched][golden]") {
  const auto& golden = trainkit::test::golden("schedulers.toml");
  for (const auto& node : *golden["lambda_case"].as_array()) {
    const auto& c = *node.as_table();
    const std::string name = c["name"].value<std::string>().value();
    DYNAMIC_SECTION(name) {
      Setup setup(c["optimizer"].value<std::string>().value());
      std::unique_ptr<LRScheduler> s;
      if (name == "LambdaLR pow") {
        s = std::make_unique<LambdaLR>(
            *setup.opt, std::vector<LrLambda>{[](int64_t e) { return std::pow(0.95, static_cast<double>(e)); },
                                              [](int64_t e) { return 1.0 / static_cast<double>(e + 1); }});
      } else {
        s = std::make_unique<MultiplicativeLR>(
            *setup.opt,
            std::vector<LrLambda>{[](int64_t) { return 0.9; }, [](int64_t e) { return e % 4 == 0 ? 0.5 : 1.0; }});
      }
      check_steps(*s, *setup.opt, c, 0, c["steps"].value<int64_t>().value());
    }
  }
}

TEST_CASE("save mid-run, load into a fresh optimizer and scheduler, and the trace continues", "[sched][resume]") {
  const auto& golden = trainkit::test::golden("schedulers.toml");
  for (const auto& node : *golden["case"].as_array()) {
    const auto& c = *node.as_table();
    const std::string name = c["name"].value<std::string>().value();
    const std::string config = c["config"].value<std::string>().value();
    const std::string kind = c["optimizer"].value<std::string>().value();
    const int64_t steps = c["steps"].value<int64_t>().value();
    const int64_t half = steps / 2 + 1;
    DYNAMIC_SECTION(name) {
      std::stringstream opt_bytes;
      std::stringstream sched_bytes;
      {
        Setup first(kind);
        auto built = make_scheduler(config, *first.opt, name);
        check_steps(*built.scheduler, *first.opt, c, 0, half);
        torch::serialize::OutputArchive oa;
        first.opt->save(oa);
        oa.save_to(opt_bytes);
        torch::serialize::OutputArchive sa;
        built.scheduler->save(sa);
        sa.save_to(sched_bytes);
      }
      Setup second(kind);
      auto built = make_scheduler(config, *second.opt, name);
      torch::serialize::InputArchive oi;
      oi.load_from(opt_bytes);
      second.opt->load(oi);
      torch::serialize::InputArchive si;
      si.load_from(sched_bytes);
      built.scheduler->load(si);
      CHECK(built.scheduler->last_epoch() == half);
      check_steps(*built.scheduler, *second.opt, c, half + 1, steps);
    }
  }
}

TEST_CASE("one scheduler drives LibTorch's SGD, Adam, AdamW and RMSprop", "[sched]") {
  at::Tensor p = torch::zeros({4}, torch::kFloat64).requires_grad_();
  const auto check = [](torch::optim::Optimizer& opt) {
    OneCycleLR s(opt, OneCycleLROptions({0.2}).total_steps(10));
    CHECK(opt.param_groups()[0].options().get_lr() == Approx(0.2 / 25));
    CHECK(get_cyclable_momentum(opt.param_groups()[0]) == Approx(0.95));
    for (int i = 0; i < 3; ++i) {
      s.step();
    }
    CHECK(opt.param_groups()[0].options().get_lr() > 0.2 / 25);
    CHECK(get_cyclable_momentum(opt.param_groups()[0]) < 0.95);
  };
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1).momentum(0.9));
  check(sgd);
  torch::optim::Adam adam({p}, torch::optim::AdamOptions(0.1));
  check(adam);
  torch::optim::AdamW adamw({p}, torch::optim::AdamWOptions(0.1));
  check(adamw);
  torch::optim::RMSprop rmsprop({p}, torch::optim::RMSpropOptions(0.1).momentum(0.5));
  check(rmsprop);
  torch::optim::Adagrad adagrad({p}, torch::optim::AdagradOptions(0.1));
  CHECK_THROWS_WITH(OneCycleLR(adagrad, OneCycleLROptions({0.2}).total_steps(10)), Contains("momentum or beta1"));
  StepLR step(adagrad, StepLROptions(2));  // schedulers without momentum cycling drive any optimizer
  step.step();
  step.step();
  CHECK(adagrad.param_groups()[0].options().get_lr() == Approx(0.01));
}

TEST_CASE("bad scheduler arguments are named with their value", "[sched][errors]") {
  Setup s("sgd");
  auto& opt = *s.opt;
  CHECK_THROWS_WITH(CosineAnnealingLR(opt, CosineAnnealingLROptions(0)), Contains("T_max") && Contains("0"));
  CHECK_THROWS_WITH(ExponentialLR(opt, ExponentialLROptions(-0.5)), Contains("gamma") && Contains("-0.5"));
  CHECK_THROWS_WITH(StepLR(opt, StepLROptions(5).gamma(-1)), Contains("gamma"));
  CHECK_THROWS_WITH(CyclicLR(opt, CyclicLROptions({0.1}, {0.01})), Contains("max_lr") && Contains("0.01"));
  CHECK_THROWS_WITH(OneCycleLR(opt, OneCycleLROptions({0.1}).total_steps(10).pct_start(1.5)),
                    Contains("pct_start") && Contains("1.5"));
  CHECK_THROWS_WITH(OneCycleLR(opt, OneCycleLROptions({0.1})), Contains("total_steps"));
  CHECK_THROWS_WITH(WarmupCosine(opt, WarmupCosineOptions(10, 10)), Contains("total_steps"));
  CHECK_THROWS_WITH(LinearLR(opt, LinearLROptions().start_factor(0)), Contains("start_factor"));
  CHECK_THROWS_WITH(ReduceLROnPlateau(opt, ReduceLROnPlateauOptions().factor(1.0)), Contains("factor"));
  CHECK_THROWS_WITH(ReduceLROnPlateau(opt, ReduceLROnPlateauOptions().mode("up")), Contains("mode"));
  CHECK_THROWS_WITH(CyclicLR(opt, CyclicLROptions({0.1, 0.2, 0.3}, {1.0})), Contains("base_lr") && Contains("3"));

  OneCycleLR one(opt, OneCycleLROptions({0.1}).total_steps(3));
  for (int i = 0; i < 3; ++i) {
    one.step();
  }
  CHECK_THROWS_WITH(one.step(), Contains("total_steps is 3"));
  ReduceLROnPlateau plateau(opt);
  CHECK_THROWS_AS(plateau.step(), std::logic_error);
  StepLR step(opt, StepLROptions(3));
  CHECK_THROWS_AS(step.step(1.0), std::logic_error);
  CHECK_THROWS_WITH(SequentialLR(opt, {std::make_shared<ReduceLROnPlateau>(opt)}, {}), Contains("ReduceLROnPlateau"));
}

TEST_CASE("the factory rejects unknown types and keys, naming the source and key", "[sched][errors]") {
  Setup s("sgd");
  CHECK_THROWS_WITH(make_scheduler("type = \"CosineLR\"\nT_max = 3", *s.opt, "cfg.toml"),
                    Contains("cfg.toml") && Contains("CosineLR") && Contains("CosineAnnealingLR"));
  CHECK_THROWS_WITH(make_scheduler("type = \"CosineAnnealingLR\"\nT_max = 3\ntmax = 4", *s.opt, "cfg.toml"),
                    Contains("unknown key 'tmax'") && Contains("T_max"));
  CHECK_THROWS_WITH(make_scheduler("type = \"StepLR\"\nstep_size = \"x\"", *s.opt, "cfg.toml"),
                    Contains("step_size") && Contains("integer"));
  CHECK_THROWS_WITH(make_scheduler("type = \"StepLR\"", *s.opt, "cfg.toml"), Contains("step_size is required"));
  CHECK_THROWS_WITH(make_scheduler("type = \"StepLR\"\nstep_size = 0", *s.opt, "cfg.toml"),
                    Contains("cfg.toml") && Contains("step_size"));
  CHECK_THROWS_WITH(make_scheduler("type = \"LambdaLR\"", *s.opt, "cfg.toml"), Contains("C++ function"));
  CHECK_THROWS_WITH(make_scheduler("type = \"StepLR\"\nstep_size = 2\ninterval = \"batch\"", *s.opt, "cfg.toml"),
                    Contains("interval"));
  CHECK(make_scheduler("type = \"OneCycleLR\"\nmax_lr = 0.1", *s.opt, "cfg", SchedulerContext{3, 10})
            .scheduler->name() == "OneCycleLR");
  const auto built = make_scheduler("type = \"OneCycleLR\"\nmax_lr = 0.1", *s.opt, "cfg", SchedulerContext{3, 10});
  CHECK(built.interval == "step");
  CHECK(dynamic_cast<OneCycleLR&>(*built.scheduler).total_steps() == 30);
}

TEST_CASE("parse_scheduler checks keys, types and values without an optimizer", "[sched][errors]") {
  CHECK(parse("type = \"CosineAnnealingLR\"\nT_max = 3").interval == "epoch");
  CHECK(parse("type = \"OneCycleLR\"\nmax_lr = 0.1").interval == "step");
  CHECK_THROWS_AS(parse("type = \"StepLR\"\nstep_size = 0"), trainkit::ArgError);
  CHECK_THROWS_WITH(parse("type = \"CyclicLR\"\nbase_lr = 0.1\nmax_lr = 0.01"),
                    Contains("cfg.toml") && Contains("max_lr") && Contains("base_lr"));
  CHECK_THROWS_WITH(parse("type = \"ReduceLROnPlateau\"\nfactor = 1.5"), Contains("factor"));
  CHECK_THROWS_WITH(parse("type = \"OneCycleLR\"\nmax_lr = 0.1\npct_start = 2.0"), Contains("pct_start"));
  CHECK_THROWS_WITH(parse("type = \"ReduceLROnPlateau\"\ninterval = \"step\""), Contains("interval must be"));
  CHECK_THROWS_WITH(parse("type = \"SequentialLR\"\nmilestones = [2, 4]\n[[schedulers]]\ntype = \"ConstantLR\"\n"
                          "[[schedulers]]\ntype = \"ExponentialLR\"\ngamma = 0.9\n"),
                    Contains("milestones"));
  CHECK_THROWS_WITH(parse("type = \"ChainedScheduler\"\n[[schedulers]]\ntype = \"StepLR\"\nstep_size = -1\n"),
                    Contains("cfg.toml.schedulers[0]") && Contains("step_size"));
  // What needs the optimizer or the run length is found when building, named by the table.
  Setup s("adam");
  const auto unknown_length = parse("type = \"WarmupCosine\"\nwarmup_steps = 2");
  CHECK_THROWS_WITH(trainkit::sched::make_scheduler(unknown_length, *s.opt), Contains("cfg.toml") && Contains("total_steps"));
  CHECK_THROWS_WITH(trainkit::sched::make_scheduler(parse("type = \"OneCycleLR\"\nmax_lr = [0.1, 0.2, 0.3]"), *s.opt,
                                                    SchedulerContext{3, 10}),
                    Contains("cfg.toml") && Contains("max_lr"));
}

TEST_CASE("WarmupStableDecay and InverseSqrt: lengths from the run, defaults and bad arguments", "[sched][wsd]") {
  Setup s("sgd");
  // Without num_training_steps (or num_stable_steps) the schedule spans the run; decay_ratio is of that length.
  const auto wsd = parse("type = \"WarmupStableDecay\"\nnum_warmup_steps = 10\ndecay_ratio = 0.2");
  CHECK(wsd.interval == "step");
  auto built = trainkit::sched::make_scheduler(wsd, *s.opt, SchedulerContext{4, 25});
  auto& schedule = dynamic_cast<WarmupStableDecay&>(*built.scheduler);
  CHECK(schedule.num_decay_steps() == 20);
  CHECK(schedule.num_stable_steps() == 70);
  for (int i = 0; i < 80; ++i) {
    schedule.step();
  }
  CHECK(schedule.get_last_lr()[0] == 0.1);  // step 80 starts the decay, at the base LR
  schedule.step();
  CHECK(schedule.get_last_lr()[0] < 0.1);
  CHECK_THROWS_WITH(trainkit::sched::make_scheduler(wsd, *s.opt),
                    Contains("cfg.toml") && Contains("num_training_steps is required"));
  // Checks that need no run length fail at parse time.
  CHECK_THROWS_WITH(parse("type = \"WarmupStableDecay\"\nnum_warmup_steps = 10"),
                    Contains("cfg.toml") && Contains("num_decay_steps and decay_ratio"));
  // A decay of the whole run leaves no room for the warmup: found when the run length is known.
  const auto whole = parse("type = \"WarmupStableDecay\"\nnum_warmup_steps = 1\ndecay_ratio = 1.0");
  CHECK_THROWS_WITH(trainkit::sched::make_scheduler(whole, *s.opt, SchedulerContext{1, 30}),
                    Contains("cfg.toml") && Contains("num_training_steps: 30") &&
                        Contains("num_warmup_steps + decay steps"));
  CHECK_THROWS_WITH(parse("type = \"WarmupStableDecay\"\nnum_warmup_steps = 1\nnum_decay_steps = 2\n"
                          "decay_type = \"sqrt\""),
                    Contains("decay_type") && Contains("1-sqrt"));
  CHECK_THROWS_WITH(parse("type = \"WarmupStableDecay\"\nnum_warmup_steps = 1\ndecay_ratio = 0.1\n"
                          "num_stable_steps = 5"),
                    Contains("decay_ratio needs num_training_steps"));
  // In C++: the same rules, named with their values.
  auto& opt = *s.opt;
  CHECK_THROWS_WITH(WarmupStableDecay(opt, WarmupStableDecayOptions(5).num_decay_steps(10).num_training_steps(12)),
                    Contains("num_training_steps") && Contains("12"));
  CHECK_THROWS_WITH(
      WarmupStableDecay(opt, WarmupStableDecayOptions(5).num_decay_steps(1).num_stable_steps(1).num_training_steps(7)),
      Contains("num_training_steps and num_stable_steps"));
  CHECK_THROWS_WITH(WarmupStableDecay(opt, WarmupStableDecayOptions(-1).num_decay_steps(1).num_stable_steps(1)),
                    Contains("num_warmup_steps") && Contains("-1"));
  CHECK_THROWS_WITH(
      WarmupStableDecay(opt, WarmupStableDecayOptions(0).num_decay_steps(1).num_stable_steps(1).min_lr_ratio(1.5)),
      Contains("min_lr_ratio") && Contains("1.5"));
  CHECK_THROWS_WITH(InverseSqrt(opt, InverseSqrtOptions(4).timescale(0)), Contains("timescale") && Contains("0"));
  // timescale defaults to the warmup, or 10000 without one.
  CHECK(InverseSqrt(opt, InverseSqrtOptions(4)).timescale() == 4);
  CHECK(InverseSqrt(opt, InverseSqrtOptions(0)).timescale() == 10000);
}

TEST_CASE("a user's own scheduler type registers with the factory", "[sched][factory]") {
  register_scheduler("HalvingLR", "epoch", [](trainkit::ArgReader& args, const std::string&) -> SchedulerMaker {
    const int64_t every = args.required_integer("every");
    if (every < 1) {
      args.fail("every", "an integer >= 1");
    }
    return [every](torch::optim::Optimizer& opt, const SchedulerContext&) {
      return std::make_shared<StepLR>(opt, StepLROptions(every).gamma(0.5));
    };
  });
  Setup s("sgd");
  auto built = make_scheduler("type = \"HalvingLR\"\nevery = 2", *s.opt, "mine.toml");
  CHECK(built.interval == "epoch");
  built.scheduler->step();
  built.scheduler->step();
  CHECK(built.scheduler->get_last_lr()[0] == Approx(0.05));
  CHECK_THROWS_WITH(make_scheduler("type = \"HalvingLR\"\nevery = 0", *s.opt, "mine.toml"),
                    Contains("mine.toml: every: expected an integer >= 1, got 0"));
  CHECK_THROWS_WITH(make_scheduler("type = \"HalvingLR\"\nevery = 2\ngamma = 3", *s.opt, "mine.toml"),
                    Contains("unknown key 'gamma'"));
  const auto types = scheduler_types();
  CHECK(std::find(types.begin(), types.end(), "HalvingLR") != types.end());
}

TEST_CASE("one binding per scheduler: the config's rule, the C++ check and the docs agree", "[sched][factory]") {
  Setup s("sgd");
  // The same rule, and the same words, for a [scheduler] table and for options built in C++.
  CHECK_THROWS_WITH(make_scheduler("type = \"StepLR\"\nstep_size = 2\ngamma = -1", *s.opt, "cfg.toml"),
                    Contains("cfg.toml") && Contains("gamma: expected a number >= 0, got -1"));
  CHECK_THROWS_WITH(StepLR(*s.opt, StepLROptions(2).gamma(-1)), Contains("StepLR: gamma: expected a number >= 0, got -1"));
  CHECK_THROWS_WITH(LinearLR(*s.opt, LinearLROptions().start_factor(0)),
                    Contains("LinearLR: start_factor: expected a number in (0, 1], got 0"));
  CHECK_THROWS_WITH(ReduceLROnPlateau(*s.opt, ReduceLROnPlateauOptions().threshold_mode("relative")),
                    Contains("ReduceLROnPlateau: threshold_mode: expected one of \"rel\", \"abs\""));
  CHECK_THROWS_WITH(make_scheduler("type = \"ExponentialLR\"", *s.opt, "cfg.toml"), Contains("gamma is required"));
  // Per-group values: one number or one per group, never an empty array.
  CHECK(parse("type = \"CyclicLR\"\nbase_lr = [0.01, 0.02]\nmax_lr = 0.1").type == "CyclicLR");
  CHECK_THROWS_WITH(parse("type = \"CyclicLR\"\nbase_lr = []\nmax_lr = 0.1"), Contains("base_lr: expected"));

  // Every documented key of every type is read by the type's reader at its documented default.
  const std::map<std::string, std::string> required = {
      {"StepLR", "step_size = 2"},       {"MultiStepLR", "milestones = [2]"},
      {"ExponentialLR", "gamma = 0.9"},  {"CosineAnnealingLR", "T_max = 3"},
      {"CosineAnnealingWarmRestarts", "T_0 = 3"}, {"WarmupCosine", "warmup_steps = 2"},
      {"CyclicLR", "base_lr = 0.01\nmax_lr = 0.1"}, {"OneCycleLR", "max_lr = 0.1"},
      {"WarmupStableDecay", "num_warmup_steps = 2\nnum_decay_steps = 3"}, {"InverseSqrt", "num_warmup_steps = 2"}};
  size_t keys = 0;
  for (const auto& type : scheduler_types()) {
    const auto docs = scheduler_arg_docs(type);
    if (type == "SequentialLR" || type == "ChainedScheduler" || docs.empty()) {
      continue;
    }
    const auto r = required.find(type);
    const std::string base = "type = \"" + type + "\"\n" + (r == required.end() ? "" : r->second + "\n");
    for (const auto& arg : docs) {
      if (arg.default_value.size() < 2 || arg.default_value.front() != '`') {
        continue;  // "required", "the run"
      }
      INFO(type << "." << arg.key << " = " << arg.default_value);
      const std::string value = arg.default_value.substr(1, arg.default_value.size() - 2);
      CHECK_NOTHROW(parse(base + arg.key + " = " + value));
      ++keys;
    }
  }
  CHECK(keys == 43);
  const auto step = scheduler_arg_docs("StepLR");
  REQUIRE(step.size() == 2);
  CHECK(step[0].key == "step_size");
  CHECK(step[0].default_value == "required");
  CHECK(step[1].default_value == "`0.1`");
}

// The schedulers of one param group share its initial_lr (as PyTorch keeps it in the group). An optimizer
// created where a freed one's options lived, over other parameters, must start from its own LR, although a
// scheduler of the freed optimizer is still alive (it dangles, unused, as a user's global might).
TEST_CASE("a new optimizer at a freed optimizer's address does not inherit its initial_lr",
          "[sched][initial_lr][may-skip]") {
  auto old_param = torch::zeros({3}, torch::requires_grad());
  auto old_opt = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{old_param}, torch::optim::SGDOptions(0.1));
  // OneCycleLR records initial_lr = max_lr / div_factor = 0.04 for the group.
  OneCycleLR old_schedule(*old_opt, OneCycleLROptions({1.0}).total_steps(10).div_factor(25.0));
  REQUIRE(old_schedule.get_last_lr()[0] == Approx(0.04));
  auto new_param = torch::zeros({3}, torch::requires_grad());  // before the free: it allocates too
  const void* freed = &old_opt->param_groups()[0].options();
  old_opt.reset();
  // glibc hands freed memory back last-in first-out: the freed group options' block is on top, the freed
  // defaults' next, and a new optimizer allocates its defaults first. Two blocks taken and given back in the
  // other order put the defaults' block on top, so the new group's options land where the old ones were.
  {
    auto first = std::make_unique<torch::optim::SGDOptions>(0.0);
    auto second = std::make_unique<torch::optim::SGDOptions>(0.0);
    first.reset();
    second.reset();
  }
  // Other allocators differ: keep trying (holding the misses, so that each try gets other memory).
  std::vector<std::unique_ptr<torch::optim::SGD>> misses;
  std::unique_ptr<torch::optim::SGD> reused;
  for (int i = 0; i < 64 && !reused; ++i) {
    auto opt = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{new_param}, torch::optim::SGDOptions(0.5));
    (&opt->param_groups()[0].options() == freed ? reused : misses.emplace_back()) = std::move(opt);
  }
  if (!reused) {
    TRAINKIT_SKIP("the allocator reused no freed options' address in 64 tries (e.g. ASan's quarantine)");
  }
  // LambdaLR's LR is initial_lr * lambda(epoch): with the freed group's 0.04 it would start there.
  const auto one = [](int64_t) { return 1.0; };
  LambdaLR schedule(*reused, one);
  CHECK(schedule.get_last_lr()[0] == 0.5);
  // The schedulers of one group still share it: OneCycleLR sets initial_lr = max_lr / div_factor = 0.2.
  OneCycleLR cycle(*reused, OneCycleLROptions({2.0}).total_steps(10).div_factor(10.0));
  LambdaLR after(*reused, one);
  CHECK(after.get_last_lr()[0] == Approx(0.2));
}
