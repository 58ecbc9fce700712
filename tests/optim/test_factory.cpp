// The optimizer registry and factory (trainkit/optim/factory.h): defaults equal each Options type's,
// every error names where, key and value, a user's optimizer registers like the built-in ones, and an
// optimizer built by name steps exactly as one constructed directly.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/optim.h"

using namespace trainkit::optim;
using trainkit::ArgError;
using trainkit::ArgReader;
using trainkit::ArgTable;
using trainkit::ArgValue;
using trainkit::test::WhatContains;

namespace {

OptimizerSpec parse(const std::string& name, const ArgTable& table, const std::string& where = "t.toml") {
  ArgReader reader(table, where);
  return parse_optimizer(name, reader);
}

double number_of(const ArgTable& table, const std::string& key) {
  const ArgValue* v = trainkit::find_arg(table, key);
  REQUIRE(v != nullptr);
  return v->as_number().value();
}

bool flag_of(const ArgTable& table, const std::string& key) {
  const ArgValue* v = trainkit::find_arg(table, key);
  REQUIRE(v != nullptr);
  REQUIRE(v->get_if<bool>() != nullptr);
  return *v->get_if<bool>();
}

/// A user's optimizer written on OptimizerBase: signSGD, p ← p - lr·sign(g) (Bernstein et al. 2018,
/// arXiv 1802.04434).
struct SignSgdOptions : public torch::optim::OptimizerCloneableOptions<SignSgdOptions> {
  SignSgdOptions() = default;
  SignSgdOptions(double lr) : lr_(lr) {}  // NOLINT(google-explicit-constructor)
  TORCH_ARG(double, lr) = 0.01;
  TORCH_ARG(double, weight_decay) = 0;

 public:
  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { lr_ = lr; }
};

struct SignSgdParamState : public torch::optim::OptimizerCloneableParamState<SignSgdParamState> {};

class SignSgd : public OptimizerBase<SignSgd, SignSgdOptions, SignSgdParamState> {
 public:
  static constexpr const char* kName = "SignSgd";
  using OptimizerBase::OptimizerBase;
  static void validate(const SignSgdOptions& o) {
    if (!(o.lr() >= 0)) {
      throw std::invalid_argument("SignSgd: invalid learning rate (lr): " + std::to_string(o.lr()));
    }
  }

 private:
  friend OptimizerBase;
  void update(const at::Tensor& inv_scale) {
    for (size_t gi = 0; gi < param_groups().size(); ++gi) {
      const auto& o = group_options(gi);
      for (const auto& p : param_groups()[gi].params()) {
        if (p.grad().defined()) {
          at::Tensor g = inv_scale.defined() ? p.grad() * inv_scale : p.grad();
          p.add_(g.add(p, o.weight_decay()).sign(), -o.lr());
        }
      }
    }
  }
};

/// signsgd in the factory while it lives: the other test files, which may run in the same process, see the
/// built-in optimizers only (test_config compares the generated key table with docs/config.md).
struct SignSgdRegistered {
  SignSgdRegistered() {
    register_optimizer(OptimizerBinding<SignSgd>("signsgd")
                           .bind(TRAINKIT_OPTION(lr), positive(), "Learning rate")
                           .bind(TRAINKIT_OPTION(weight_decay), non_negative(), "L2 penalty added to the gradient")
                           .entry());
  }
  ~SignSgdRegistered() { unregister_optimizer("signsgd"); }
  SignSgdRegistered(const SignSgdRegistered&) = delete;
  SignSgdRegistered& operator=(const SignSgdRegistered&) = delete;
};

std::vector<at::Tensor> params_of(uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({5, 4}, torch::kFloat64).requires_grad_(), torch::randn({4}, torch::kFloat64).requires_grad_()};
}

void set_cos_grads(const std::vector<at::Tensor>& params, int step) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].mutable_grad() = torch::cos(params[i] * (1.0 + 0.2 * static_cast<double>(i)) + 0.1 * step);
  }
}

/// Five steps of `x` on `a` and `y` on `b` (equal copies) leave equal parameters.
void steps_equal(torch::optim::Optimizer& x, torch::optim::Optimizer& y, const std::vector<at::Tensor>& a,
                 const std::vector<at::Tensor>& b) {
  for (int step = 0; step < 5; ++step) {
    set_cos_grads(a, step);
    set_cos_grads(b, step);
    x.step();
    y.step();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(torch::equal(a[i], b[i]));
  }
}

}  // namespace

TEST_CASE("the factory knows the built-in optimizers, with each Options type's defaults", "[optim][factory]") {
  const auto names = optimizer_names();
  for (const char* name : {"adadelta", "adafactor", "adagrad", "adam", "adamax", "adamw", "asgd", "lamb", "lars", "lion", "nadam", "radam", "rprop", "sgd"}) {
    CHECK(std::find(names.begin(), names.end(), name) != names.end());
  }
  SECTION("adam") {
    const auto spec = parse("adam", {});
    const auto& o = static_cast<const AdamOptions&>(*spec.options);
    const AdamOptions d;
    CHECK(o.lr() == d.lr());
    CHECK(o.betas() == d.betas());
    CHECK(o.eps() == d.eps());
    CHECK(o.weight_decay() == d.weight_decay());
    CHECK(o.amsgrad() == d.amsgrad());
    CHECK_FALSE(o.fused().has_value());
    const ArgTable args = optimizer_args(spec);
    CHECK(number_of(args, "lr") == 1e-3);
    CHECK(trainkit::find_arg(args, "betas")->to_string() == "[0.9, 0.999]");
    CHECK(number_of(args, "eps") == 1e-8);
    CHECK(number_of(args, "weight_decay") == 0.0);
    CHECK_FALSE(flag_of(args, "amsgrad"));
    CHECK_FALSE(flag_of(args, "no_decay_1d"));
    CHECK(trainkit::find_arg(args, "fused") == nullptr);  // unset: left out
    CHECK(trainkit::find_arg(args, "momentum") == nullptr);
  }
  SECTION("adamw") {
    const auto spec = parse("adamw", {});
    CHECK(static_cast<const AdamWOptions&>(*spec.options).weight_decay() == AdamWOptions().weight_decay());
    CHECK(number_of(optimizer_args(spec), "weight_decay") == 0.01);
  }
  SECTION("sgd") {
    const auto args = optimizer_args(parse("sgd", {}));
    const SgdOptions d;
    CHECK(number_of(args, "lr") == d.lr());
    CHECK(number_of(args, "momentum") == d.momentum());
    CHECK(number_of(args, "dampening") == d.dampening());
    CHECK(flag_of(args, "nesterov") == d.nesterov());
  }
  SECTION("lars") {
    const auto args = optimizer_args(parse("lars", {}));
    const LarsOptions d;
    CHECK(number_of(args, "lr") == d.lr());
    CHECK(number_of(args, "trust_coefficient") == d.trust_coefficient());
    CHECK(number_of(args, "eps") == d.eps());
    CHECK(flag_of(args, "trust_clip") == d.trust_clip());
    CHECK(flag_of(args, "always_adapt") == d.always_adapt());
  }
  SECTION("lamb") {
    const auto spec = parse("lamb", {});
    const LambOptions d;
    const auto args = optimizer_args(spec);
    CHECK(number_of(args, "eps") == d.eps());
    CHECK(number_of(args, "weight_decay") == d.weight_decay());
    CHECK(number_of(args, "max_grad_norm") == d.max_grad_norm().value());
    CHECK(flag_of(args, "bias_correction") == d.bias_correction());
    CHECK(flag_of(args, "grad_averaging") == d.grad_averaging());
    // 0 means no clipping, and prints back as 0.
    const auto none = parse("lamb", {{"max_grad_norm", 0.0}});
    CHECK_FALSE(static_cast<const LambOptions&>(*none.options).max_grad_norm().has_value());
    CHECK(number_of(optimizer_args(none), "max_grad_norm") == 0.0);
    // TOML's integer 0 is the same "unset" as 0.0.
    const auto none_int = parse("lamb", {{"max_grad_norm", ArgValue(int64_t{0})}});
    CHECK_FALSE(static_cast<const LambOptions&>(*none_int.options).max_grad_norm().has_value());
  }
}

TEST_CASE("optimizer_args round-trips through parse_optimizer", "[optim][factory]") {
  for (const auto& name : {"adam", "adamw", "sgd", "lars", "lamb"}) {
    DYNAMIC_SECTION(name) {
      const ArgTable set{{"lr", 0.5}, {"weight_decay", 0.25}, {"no_decay_1d", true}};
      const auto spec = parse(name, set);
      const ArgTable args = optimizer_args(spec);
      const auto again = parse(name, args);
      const ArgTable args_again = optimizer_args(again);
      REQUIRE(args.size() == args_again.size());
      for (size_t i = 0; i < args.size(); ++i) {
        CHECK(args[i].first == args_again[i].first);
        CHECK(args[i].second.to_string() == args_again[i].second.to_string());
      }
      CHECK(number_of(args, "lr") == 0.5);
      CHECK(flag_of(args, "no_decay_1d"));
    }
  }
}

TEST_CASE("optimizer arguments are rejected with where, key and value", "[optim][factory]") {
  CHECK_THROWS_MATCHES(parse("adamm", {}), ArgError, WhatContains("unknown optimizer \"adamm\" (known: "));
  CHECK_THROWS_MATCHES(
      parse("adam", {{"momentum", ArgValue(0.9, 2)}}, "e.toml"), ArgError,
      WhatContains("e.toml: optimizer.momentum does not apply to optimizer \"adam\" (only to lars, sgd)"));
  CHECK_THROWS_MATCHES(parse("adam", {{"trust_coefficient", 0.01}}, "e.toml"), ArgError,
                       WhatContains("optimizer.trust_coefficient does not apply to optimizer \"adam\" (only to lars)"));
  CHECK_THROWS_MATCHES(parse("lars", {{"max_grad_norm", 1.0}}), ArgError,
                       WhatContains("optimizer.max_grad_norm does not apply to optimizer \"lars\" (only to lamb)"));
  CHECK_THROWS_WITH(parse("adam", {{"lrr", ArgValue(0.1, 2)}}, "a.toml"),
                    Catch::Matchers::Contains("a.toml: unknown key 'optimizer.lrr' (line 2)") &&
                        Catch::Matchers::Contains("optimizer.lr, optimizer.betas"));
  CHECK_THROWS_MATCHES(parse("adam", {{"lr", ArgValue(-0.1, 3)}}, "d.toml"), ArgError,
                       WhatContains("d.toml: optimizer.lr: expected a number >= 0, got -0.1 (line 3)"));
  CHECK_THROWS_MATCHES(parse("adam", {{"lr", "fast"}}), ArgError,
                       WhatContains("optimizer.lr: expected a number >= 0, got \"fast\""));
  CHECK_THROWS_MATCHES(parse("lamb", {{"betas", ArgValue::Array{0.9, 1.0}}}), ArgError,
                       WhatContains("optimizer.betas: expected an array of two numbers in [0, 1), got [0.9, 1.0]"));
  CHECK_THROWS_MATCHES(parse("adam", {{"amsgrad", 1}}), ArgError,
                       WhatContains("optimizer.amsgrad: expected true or false, got 1"));
  CHECK_THROWS_MATCHES(parse("sgd", {{"no_decay_1d", "yes"}}), ArgError,
                       WhatContains("optimizer.no_decay_1d: expected true or false"));
  CHECK_THROWS_MATCHES(parse("sgd", {{"lr", 0.1}, {"nesterov", true}}), ArgError,
                       WhatContains("nesterov momentum requires a momentum > 0"));
  CHECK_THROWS_MATCHES(parse("lars", {{"nesterov", true}, {"momentum", 0.9}, {"dampening", 0.1}}), ArgError,
                       WhatContains("nesterov"));
  CHECK_NOTHROW(parse("sgd", {{"nesterov", true}, {"momentum", 0.9}}));
  // The table's name in messages comes from the caller.
  ArgTable t{{"lr", -1.0}};
  ArgReader reader(t, "cli");
  CHECK_THROWS_MATCHES(parse_optimizer("sgd", reader, "opt"), ArgError, WhatContains("cli: opt.lr: expected"));
  // Keys the caller read before are left alone.
  ArgTable named{{"name", "sgd"}, {"lr", 0.1}};
  ArgReader named_reader(named, "t.toml");
  CHECK(named_reader.required_string("name") == "sgd");
  CHECK(static_cast<const SgdOptions&>(*parse_optimizer("sgd", named_reader).options).lr() == 0.1);
}

TEST_CASE("optimizer_arg_docs lists every key once with the optimizers it applies to", "[optim][factory]") {
  const auto docs = optimizer_arg_docs();
  const auto doc = [&](const std::string& name) {
    const auto it = std::find_if(docs.begin(), docs.end(), [&](const OptimizerArgDoc& d) { return d.name == name; });
    REQUIRE(it != docs.end());
    CHECK(std::count_if(docs.begin(), docs.end(), [&](const OptimizerArgDoc& d) { return d.name == name; }) == 1);
    return *it;
  };
  CHECK(doc("momentum").optimizers == std::vector<std::string>{"lars", "sgd"});
  CHECK(doc("betas").type == "[number, number] in [0, 1)");
  CHECK(doc("lr").type == "number >= 0; adafactor: number > 0 or 0 (unset)");
  CHECK(doc("max_grad_norm").optimizers == std::vector<std::string>{"lamb"});
  const auto all = doc("no_decay_1d").optimizers;
  CHECK(all == optimizer_names());
  for (const char* key : {"lr", "betas", "eps", "weight_decay", "amsgrad", "momentum", "dampening", "nesterov",
                          "trust_coefficient", "trust_clip", "always_adapt", "bias_correction", "grad_averaging",
                          "max_grad_norm"}) {
    INFO(key);
    CHECK_FALSE(doc(key).doc.empty());
  }
}

TEST_CASE("an optimizer built by name steps exactly as one constructed directly", "[optim][factory]") {
  SECTION("lars, one group") {
    auto a = params_of(1);
    auto b = params_of(1);
    const auto spec = parse("lars", {{"lr", 0.5}, {"momentum", 0.9}, {"weight_decay", 1e-3}, {"trust_clip", true}});
    auto by_name = make_optimizer(spec, a);
    Lars direct(b, LarsOptions(0.5).momentum(0.9).weight_decay(1e-3).trust_clip(true));
    steps_equal(*by_name, direct, a, b);
  }
  SECTION("lamb with no_decay_1d") {
    auto a = params_of(2);
    auto b = params_of(2);
    const auto spec = parse("lamb", {{"lr", 0.01}, {"betas", ArgValue::Array{0.8, 0.99}}, {"no_decay_1d", true}});
    auto by_name = make_optimizer(spec, a);
    REQUIRE(by_name->param_groups().size() == 2);
    const auto options = LambOptions(0.01).betas({0.8, 0.99});
    Lamb direct(weight_decay_param_groups(b, options), options);
    steps_equal(*by_name, direct, a, b);
  }
}

TEST_CASE("a user registers an optimizer of their own", "[optim][factory]") {
  std::vector<std::string> names;
  {
    const SignSgdRegistered registered;
    names = optimizer_names();
    CHECK(std::find(names.begin(), names.end(), "signsgd") != names.end());
    CHECK_THROWS_MATCHES(register_optimizer(OptimizerBinding<SignSgd>("signsgd").entry()), std::invalid_argument,
                         WhatContains("already registered"));
  }
  CHECK_FALSE(unregister_optimizer("signsgd"));  // gone with the guard
  names = optimizer_names();
  CHECK(std::find(names.begin(), names.end(), "signsgd") == names.end());
  const SignSgdRegistered registered;
  // Its keys join the documentation and the "does not apply" messages of the others.
  CHECK_THROWS_MATCHES(parse("signsgd", {{"momentum", 0.9}}), ArgError,
                       WhatContains("optimizer.momentum does not apply to optimizer \"signsgd\" (only to lars, sgd)"));
  CHECK_THROWS_MATCHES(parse("signsgd", {{"lr", 0.0}}), ArgError, WhatContains("optimizer.lr: expected a number > 0"));
  const auto spec = parse("signsgd", {{"lr", 0.1}});
  CHECK(number_of(optimizer_args(spec), "weight_decay") == 0.0);
  auto p = torch::tensor({1.0, -2.0, 3.0}, torch::kFloat64).requires_grad_();
  auto opt = make_optimizer(spec, std::vector<at::Tensor>{p});
  p.mutable_grad() = torch::tensor({0.5, -0.5, 0.0}, torch::kFloat64);
  opt->step();
  CHECK(torch::allclose(p, torch::tensor({0.9, -1.9, 3.0}, torch::kFloat64)));
  // Validation runs on an Options object alone, and in the constructor for every group.
  CHECK_THROWS_MATCHES(SignSgd::validate(SignSgdOptions(-1.0)), std::invalid_argument, WhatContains("lr"));
  CHECK_THROWS_AS(SignSgd({p}, SignSgdOptions(-1.0)), std::invalid_argument);
}

TEST_CASE("each optimizer's validate() takes an Options object alone", "[optim][factory][validation]") {
  CHECK_THROWS_MATCHES(Adam::validate(AdamOptions().betas({0.9, 1.5})), std::invalid_argument,
                       WhatContains("Adam: betas: expected"));
  CHECK_THROWS_MATCHES(AdamW::validate(AdamWOptions().eps(-1)), std::invalid_argument, WhatContains("AdamW"));
  CHECK_THROWS_MATCHES(Sgd::validate(SgdOptions(0.1).nesterov(true)), std::invalid_argument,
                       WhatContains("Sgd: nesterov"));
  CHECK_THROWS_MATCHES(Lars::validate(LarsOptions().momentum(-1)), std::invalid_argument,
                       WhatContains("Lars: momentum: expected a number >= 0, got -1"));
  CHECK_THROWS_MATCHES(Lamb::validate(LambOptions().max_grad_norm(-2.0)), std::invalid_argument,
                       WhatContains("Lamb: max_grad_norm: expected"));
  CHECK_NOTHROW(Lamb::validate(LambOptions()));
  CHECK_THROWS_MATCHES(NAdam::validate(NAdamOptions().momentum_decay(-1)), std::invalid_argument,
                       WhatContains("NAdam: momentum_decay: expected a number >= 0, got -1"));
  CHECK_THROWS_MATCHES(RAdam::validate(RAdamOptions().betas({1.0, 0.999})), std::invalid_argument,
                       WhatContains("RAdam: betas: expected"));
  CHECK_THROWS_MATCHES(Adamax::validate(AdamaxOptions(-1e-3)), std::invalid_argument,
                       WhatContains("Adamax: lr: expected a number >= 0"));
  CHECK(NAdamOptions().lr() == 2e-3);
  CHECK(AdamaxOptions().lr() == 2e-3);
  CHECK(RAdamOptions().lr() == 1e-3);
}

TEST_CASE("every value an optimizer's binding accepts, its own validate() accepts too", "[optim][factory][validation]") {
  // validate() checks the Options against the same binding that reads the config (plus the requirements
  // across fields): a value the config reads builds an optimizer.
  const std::vector<double> numbers = {-1.0, -1e-12, 0.0, 1e-12, 0.5, 0.999999, 1.0, 2.0, 1e6};
  for (const auto& name : optimizer_names()) {
    for (const auto& arg : optimizer_arg_docs()) {
      if (std::find(arg.optimizers.begin(), arg.optimizers.end(), name) == arg.optimizers.end() ||
          arg.type == "boolean") {
        continue;
      }
      for (const double x : numbers) {
        const bool pair = arg.type.rfind("[number, number]", 0) == 0;
        const ArgValue value = pair ? ArgValue(ArgValue::Array{ArgValue(x), ArgValue(0.5)}) : ArgValue(x);
        INFO(name << " " << arg.name << " = " << value.to_string());
        try {
          (void)parse(name, {{arg.name, value}});
        } catch (const ArgError& e) {
          CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("optimizer." + arg.name + ": expected"));
        }
      }
    }
  }
}
