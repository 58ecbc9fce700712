// Options bound once (trainkit/options.h): reading under the rules with messages that name the key, printing
// back, include/rename, checks of values set in code, and the core Options structs' own bindings.
#include <torch/arg.h>

#include "support.h"
#include "trainkit/amp/grad_scaler.h"
#include "trainkit/app/config.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/options.h"
#include "trainkit/train/callbacks/early_stopping.h"
#include "trainkit/train/callbacks/model_checkpoint.h"
#include "trainkit/train/callbacks/profiler_trace.h"
#include "trainkit/train/callbacks/stochastic_weight_averaging.h"
#include "trainkit/train/ema.h"
#include "trainkit/train/trainer.h"

using trainkit::ArgError;
using trainkit::ArgReader;
using trainkit::ArgTable;
using trainkit::ArgValue;
using trainkit::OptionBinding;
namespace rule = trainkit::rule;
using Catch::Matchers::Contains;

namespace {

struct WarmupOptions {
  TORCH_ARG(int64_t, steps) = 100;
  TORCH_ARG(double, floor) = 0.1;
  TORCH_ARG(std::string, shape) = "linear";
  TORCH_ARG(std::optional<double>, cap) = std::nullopt;
  TORCH_ARG(std::chrono::milliseconds, patience) = std::chrono::milliseconds(1500);

 public:
  static const OptionBinding<WarmupOptions>& binding() {
    static const auto b = OptionBinding<WarmupOptions>()
                              .bind(TRAINKIT_OPTION(steps), rule::integer(0), "Warm-up steps")
                              .bind(TRAINKIT_OPTION(floor), rule::number(trainkit::closed_unit_interval()), "Floor")
                              .bind(TRAINKIT_OPTION(shape), rule::one_of({"linear", "cos"}), "Shape")
                              .bind(TRAINKIT_OPTION(cap), rule::number(trainkit::positive()), "Cap")
                              .bind(TRAINKIT_OPTION(patience), rule::seconds(trainkit::positive()), "Patience");
    return b;
  }
};

struct Outer {
  WarmupOptions warmup;
  bool on = false;
};

}  // namespace

TEST_CASE("OptionBinding reads, checks and prints an Options struct by its keys", "[options]") {
  const auto& b = WarmupOptions::binding();
  CHECK(b.keys() == std::vector<std::string>{"steps", "floor", "shape", "cap", "patience"});
  CHECK(b.find("floor")->type == "number in [0, 1]");
  CHECK(b.find("steps")->expected == "an integer >= 0");
  CHECK(b.find("shape")->type == "\"linear\" or \"cos\"");

  const ArgTable table = {{"steps", ArgValue(int64_t{7}, 2)}, {"shape", ArgValue("cos", 3)},
                          {"cap", ArgValue(int64_t{2})},      {"patience", ArgValue(0.25)}};
  WarmupOptions o;
  ArgReader args(table, "w.toml: [warmup]");
  trainkit::read_options(b, args, o);
  CHECK_NOTHROW(args.finish("warmup"));
  CHECK(o.steps() == 7);
  CHECK(o.floor() == 0.1);  // absent: the default stays
  CHECK(o.shape() == "cos");
  CHECK(o.cap() == 2.0);
  CHECK(o.patience() == std::chrono::milliseconds(250));

  const ArgTable printed = trainkit::options_table(b, o);
  REQUIRE(printed.size() == 5);
  CHECK(printed[3].second.to_string() == "2.0");
  CHECK(printed[4].second.to_string() == "0.25");
  CHECK(trainkit::options_table(b, WarmupOptions()).size() == 4);  // an unset optional is left out

  // Refused values name the table, the key, the rule and the line; the field keeps its value.
  for (const auto& [key, value, expected] :
       std::vector<std::tuple<std::string, ArgValue, std::string>>{
           {"steps", ArgValue(int64_t{-1}, 4), "w.toml: [warmup]: steps: expected an integer >= 0, got -1 (line 4)"},
           {"floor", ArgValue(1.5), "floor: expected a number in [0, 1], got 1.5"},
           {"shape", ArgValue("square"), "shape: expected one of \"linear\", \"cos\", got \"square\""},
           {"steps", ArgValue(2.0), "steps: expected an integer >= 0, got 2.0"},
           {"patience", ArgValue(0.0), "patience: expected a number > 0, got 0.0"}}) {
    const ArgTable bad = {{key, value}};
    ArgReader r(bad, "w.toml: [warmup]");
    WarmupOptions kept;
    CHECK_THROWS_WITH(trainkit::read_options(b, r, kept), Contains(expected));
    CHECK(kept.steps() == 100);
  }
  const ArgTable unknown = {{"stpes", ArgValue(int64_t{1})}};
  ArgReader r(unknown, "w.toml: [warmup]");
  trainkit::read_options(b, r, o);
  CHECK_THROWS_WITH(r.finish("warmup"), Contains("unknown key 'stpes'"));

  // Values set in code are checked against the same rules.
  CHECK_NOTHROW(trainkit::check_options(b, WarmupOptions(), "WarmupOptions"));
  CHECK_THROWS_WITH(trainkit::check_options(b, WarmupOptions().floor(2.0), "WarmupOptions"),
                    Contains("WarmupOptions: floor: expected a number in [0, 1], got 2.0"));
}

TEST_CASE("OptionBinding::include reaches an inner struct's fields, some of them, renamed", "[options]") {
  const auto b = OptionBinding<Outer>()
                     .bind("on", [](auto& o) -> auto& { return o.on; }, rule::boolean(), "On")
                     .include(WarmupOptions::binding(), [](auto& o) -> auto& { return o.warmup; }, {"steps", "shape"},
                              {{"steps", "warmup_steps"}});
  CHECK(b.keys() == std::vector<std::string>{"on", "warmup_steps", "shape"});
  CHECK(b.find("warmup_steps")->doc == "Warm-up steps");
  Outer o;
  REQUIRE(b.find("warmup_steps")->read(ArgValue(int64_t{3}), o));
  CHECK(o.warmup.steps() == 3);
  CHECK_FALSE(b.find("shape")->read(ArgValue("square"), o));
  CHECK(o.warmup.shape() == "linear");
  CHECK(b.find("warmup_steps")->show(o)->to_string() == "3");
}

TEST_CASE("Every core Options binding accepts its own defaults", "[options]") {
  using namespace trainkit;
  CHECK_NOTHROW(check_options(train::ModelEmaOptions::binding(), train::ModelEmaOptions(), "ema"));
  CHECK_NOTHROW(check_options(train::StochasticWeightAveragingOptions::binding(),
                              train::StochasticWeightAveragingOptions(), "swa"));
  CHECK_NOTHROW(check_options(train::EarlyStoppingOptions::binding(), train::EarlyStoppingOptions(), "es"));
  CHECK_NOTHROW(check_options(train::ModelCheckpointOptions::binding(), train::ModelCheckpointOptions(), "mc"));
  CHECK_NOTHROW(check_options(train::ProfilerTraceOptions::binding(), train::ProfilerTraceOptions("t.json"), "pt"));
  CHECK_NOTHROW(check_options(train::TrainerOptions::binding(), train::TrainerOptions(), "trainer"));
  CHECK_NOTHROW(check_options(amp::GradScalerOptions::binding(), amp::GradScalerOptions(), "scaler"));
  CHECK_NOTHROW(check_options(dist::InitOptions::binding(), dist::InitOptions(), "group"));
  CHECK_NOTHROW(check_options(dist::DistributedDataParallelOptions::binding(), dist::DistributedDataParallelOptions(),
                              "ddp"));
}

TEST_CASE("A config key of a core component is that component's Options field", "[options][config]") {
  // Read through the config: each value lands in the core Options struct that build_run hands on as it is.
  const auto c = trainkit::app::parse_config(
      "[ema]\nwarmup_gamma = 7.0\n[grad]\nclip_norm = 0.5\nclip_value = 0.25\n[profile]\nsync = true\n"
      "trace_wait = 2\n[distributed]\ntimeout = 1.5\nbucket_cap_mb = 4.0\n[amp]\ngrowth_interval = 9\n"
      "[checkpoint]\nsave_top_k = 3\n",
      "c.toml");
  CHECK(c.ema.options.warmup_gamma() == 7.0);
  CHECK(c.trainer.clip_grad_norm() == 0.5);
  CHECK(c.trainer.clip_grad_value() == 0.25);
  CHECK(c.trainer.profile_sync());
  CHECK(c.profile.trace.wait() == 2);
  CHECK(c.distributed.group.timeout() == std::chrono::milliseconds(1500));
  CHECK(c.distributed.ddp.bucket_cap_mb() == 4.0);
  CHECK(c.amp.scaler.growth_interval() == 9);
  CHECK(c.checkpoint.best.save_top_k() == 3);
  // The defaults are the core's, except where the config documents its own.
  const trainkit::app::Config d;
  CHECK(d.ema.options.decay() == trainkit::train::ModelEmaOptions().decay());
  CHECK(d.amp.scaler.init_scale() == trainkit::amp::GradScalerOptions().init_scale());
  CHECK(d.trainer.epochs() == 12);
  CHECK(d.checkpoint.best.save_top_k() == 0);
  // The rule and the message come from the core binding, named by the config key.
  CHECK_THROWS_WITH(trainkit::app::parse_config("[ema]\nwarmup_gamma = 0\n", "c.toml"),
                    Contains("c.toml: ema.warmup_gamma: expected a number > 0, got 0 (line 2)"));
  CHECK_THROWS_WITH(trainkit::app::parse_config("", "c.toml", {"grad.clip_norm=-1"}),
                    Contains("--set grad.clip_norm=-1: expected a number >= 0, got -1"));
}
