// trainkit::optim against independent references: torch.optim.Adam/AdamW/SGD/RAdam/NAdam/Adamax and timm's Lars/Lamb
// trajectories (tests/golden/optim.toml, float64, fused, reference and foreach paths), foreach == reference
// to 1 ulp, ATen's fused kernels (_fused_adam_ ...) == reference to a few ulp, fused == reference on larger
// float32/float64 problems, save/load round trips, convergence, validation, the GradScaler hook.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>

#include <torch/torch.h>

#include "detail/kernels.h"
#include "optim/golden_problem.h"
#include "support.h"
#include "trainkit/optim.h"
#include "trainkit/sched/cyclic.h"

using namespace trainkit::optim;
using trainkit::test::WhatContains;

namespace {

using OptimizerPtr = std::unique_ptr<torch::optim::Optimizer>;

/// The op name prefix count_ops() counts, and its count.
const char* g_op_prefix = "";
std::atomic<int64_t> g_ops{0};

/// How many ATen ops whose names begin with `prefix` (e.g. "aten::_foreach_") `body` runs.
int64_t count_ops(const char* prefix, const std::function<void()>& body) {
  g_op_prefix = prefix;
  g_ops = 0;
  const auto handle = at::addGlobalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (std::string(fn.name()).rfind(g_op_prefix, 0) == 0) {
          ++g_ops;
        }
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  body();
  at::removeCallback(handle);
  return g_ops.load();
}

std::vector<int64_t> shape_of(const toml::node& node) {
  std::vector<int64_t> shape;
  for (const auto& d : *node.as_array()) {
    shape.push_back(d.value<int64_t>().value());
  }
  return shape;
}

std::vector<double> doubles_of(const toml::node& node) { return trainkit::test::values_of<double>(node); }

/// A golden case's scalar or array of numbers as an ArgValue.
trainkit::ArgValue arg_of(const toml::node& node) {
  if (const auto* a = node.as_array()) {
    trainkit::ArgValue::Array out;
    for (const auto& e : *a) {
      out.push_back(arg_of(e));
    }
    return out;
  }
  if (const auto* b = node.as_boolean()) {
    return b->get();
  }
  if (const auto* i = node.as_integer()) {
    return i->get();
  }
  return node.value<double>().value();
}

/// The optimizer arguments of a golden case (or its group1 table) under trainkit's names, added to `table`:
/// timm's trust_coeff is trust_coefficient, and "none" (max_grad_norm, Adafactor's lr) is the factory's 0
/// (unset: no clipping, the relative step).
void add_case_args(const toml::table& t, trainkit::ArgTable& table) {
  for (const auto& [key, node] : t) {
    const std::string k(key.str());
    if (k == "optimizer" || k == "steps" || k == "record" || k == "group1" || k == "dtype") {
      continue;
    }
    if (node.is_string()) {
      trainkit::set_arg(table, k, 0.0);
    } else {
      trainkit::set_arg(table, k == "trust_coeff" ? "trust_coefficient" : k, arg_of(node));
    }
  }
}

/// An optimizer's computation path: the fused CPU kernel, the per-tensor ATen reference, the multi-tensor
/// `_foreach_*` path, or ATen's fused kernels (`_fused_adam_` ...; Adam, AdamW and SGD only).
enum class Path { fused, reference, foreach, aten };

const char* path_name(Path path) {
  switch (path) {
    case Path::fused:
      return " fused";
    case Path::reference:
      return " reference";
    case Path::foreach:
      return " foreach";
    default:
      return " aten_fused";
  }
}

/// Whether optimizer `name` (the factory's) takes argument `key`.
bool takes_arg(const std::string& name, const std::string& key) {
  static const auto docs = optimizer_arg_docs();  // built from the whole registry: once (~10% of this file's run)
  for (const auto& doc : docs) {
    if (doc.name == key) {
      return std::find(doc.optimizers.begin(), doc.optimizers.end(), name) != doc.optimizers.end();
    }
  }
  return false;
}

/// Whether optimizer `name` (the factory's) has path `path`: each path but the reference one where it takes
/// the path's argument (Adadelta, ASGD and Rprop have no fused kernel, Adafactor only the reference path).
bool has_path(const std::string& name, Path path) {
  switch (path) {
    case Path::fused:
      return takes_arg(name, "fused");
    case Path::foreach:
      return takes_arg(name, "foreach");
    case Path::aten:
      return takes_arg(name, "aten_fused");
    default:
      return true;
  }
}

/// The spec of a golden case through the optimizer factory (the same names a config file uses).
OptimizerSpec case_spec(const std::string& name, trainkit::ArgTable table, Path path) {
  if (!has_path(name, Path::fused)) {  // no path to choose
    trainkit::ArgReader reader(table, "golden case");
    return parse_optimizer(name, reader);
  }
  if (path == Path::aten) {
    trainkit::set_arg(table, "aten_fused", true);
  } else if (has_path(name, Path::fused)) {
    trainkit::set_arg(table, "fused", path == Path::fused);
  }
  trainkit::set_arg(table, "foreach", path == Path::foreach);
  trainkit::ArgReader reader(table, "golden case");
  return parse_optimizer(name, reader);
}

/// Builds the optimizer of a golden case on two param groups, on the fused or the reference path: group 1
/// takes the case's arguments with its group1 overrides on top.
OptimizerPtr make_case_optimizer(const toml::table& c, const std::vector<at::Tensor>& g0,
                                 const std::vector<at::Tensor>& g1, Path path) {
  const std::string name = c["optimizer"].value<std::string>().value();
  trainkit::ArgTable base;
  add_case_args(c, base);
  trainkit::ArgTable over = base;
  add_case_args(*c["group1"].as_table(), over);
  const OptimizerSpec spec0 = case_spec(name, base, path);
  const OptimizerSpec spec1 = case_spec(name, over, path);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(g0, spec0.options->clone());
  groups.emplace_back(g1, spec1.options->clone());
  return make_optimizer(spec0, groups);
}

void require_close_values(const at::Tensor& got, const std::vector<double>& want, double rel) {
  const at::Tensor flat = got.detach().flatten().contiguous();
  REQUIRE(flat.numel() == static_cast<int64_t>(want.size()));
  const double* g = flat.data_ptr<double>();
  for (size_t k = 0; k < want.size(); ++k) {
    INFO("element " << k << ": got " << g[k] << " want " << want[k]);
    REQUIRE(std::abs(g[k] - want[k]) <= rel * std::abs(want[k]) + 1e-13);
  }
}

/// The state tensor `key` of parameter `p` in `opt`, as the optimizer saves it (PyTorch's state_dict names).
at::Tensor saved_state(torch::optim::Optimizer& opt, const at::Tensor& p, const std::string& key) {
  torch::serialize::OutputArchive out;
  opt.state().at(p.unsafeGetTensorImpl())->serialize(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream in(bytes.str());
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  at::Tensor t;
  archive.read(key, t);
  return t;
}

/// Fresh parameters of random values for the comparison tests.
std::vector<at::Tensor> random_params(const std::vector<std::vector<int64_t>>& shapes, at::ScalarType dtype,
                                      uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> out;
  for (const auto& s : shapes) {
    out.push_back(torch::randn(s, torch::TensorOptions().dtype(dtype)).requires_grad_());
  }
  return out;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) {
    out.push_back(p.detach().clone().requires_grad_());
  }
  return out;
}

/// Gives every parameter a gradient that depends on the parameter (so trajectories can diverge).
void set_grads(const std::vector<at::Tensor>& params, int step) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    p.mutable_grad() = torch::sin(p * (1.0 + 0.1 * static_cast<double>(i)) + 0.05 * step) + 0.1 * p;
  }
}

/// A factory for each optimizer with non-default options, so every branch of each kernel is exercised.
using Factory = std::function<OptimizerPtr(const std::vector<at::Tensor>&, std::optional<bool> fused)>;
std::vector<std::pair<std::string, Factory>> factories() {
  return {
      {"Adam", [](const auto& p, auto f) { return std::make_unique<Adam>(p, AdamOptions(1e-2).weight_decay(0.1).fused(f)); }},
      {"Adam amsgrad maximize",
       [](const auto& p, auto f) {
         return std::make_unique<Adam>(p, AdamOptions(1e-2).amsgrad(true).maximize(true).fused(f));
       }},
      {"AdamW", [](const auto& p, auto f) { return std::make_unique<AdamW>(p, AdamWOptions(1e-2).fused(f)); }},
      {"Sgd nesterov",
       [](const auto& p, auto f) {
         return std::make_unique<Sgd>(p, SgdOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3).fused(f));
       }},
      {"Sgd dampening",
       [](const auto& p, auto f) {
         return std::make_unique<Sgd>(p, SgdOptions(0.05).momentum(0.9).dampening(0.5).fused(f));
       }},
      {"Lars",
       [](const auto& p, auto f) {
         return std::make_unique<Lars>(p, LarsOptions(0.5).momentum(0.9).weight_decay(1e-3).trust_clip(true).fused(f));
       }},
      {"Lamb", [](const auto& p, auto f) { return std::make_unique<Lamb>(p, LambOptions(1e-2).fused(f)); }},
      {"Lamb no clip, always adapt",
       [](const auto& p, auto f) {
         return std::make_unique<Lamb>(
             p, LambOptions(1e-2).max_grad_norm(std::nullopt).weight_decay(0).always_adapt(true).fused(f));
       }},
      {"RAdam decoupled",
       [](const auto& p, auto f) {
         return std::make_unique<RAdam>(p, RAdamOptions(1e-2).weight_decay(0.1).decoupled_weight_decay(true).fused(f));
       }},
      {"NAdam maximize",
       [](const auto& p, auto f) {
         return std::make_unique<NAdam>(p, NAdamOptions(1e-2).weight_decay(0.1).momentum_decay(0.05).maximize(true).fused(f));
       }},
      {"Adamax", [](const auto& p, auto f) { return std::make_unique<Adamax>(p, AdamaxOptions(1e-2).weight_decay(0.1).fused(f)); }},
      {"Lion",
       [](const auto& p, auto f) {
         return std::make_unique<Lion>(p, LionOptions(1e-2).weight_decay(0.1).betas({0.3, 0.99}).fused(f));
       }},
      {"Lion maximize",
       [](const auto& p, auto f) {
         return std::make_unique<Lion>(p, LionOptions(1e-2).betas({0.9, 0.2}).maximize(true).fused(f));
       }},
      {"Adagrad",
       [](const auto& p, auto f) {
         return std::make_unique<Adagrad>(
             p, AdagradOptions(0.1).lr_decay(0.01).weight_decay(0.01).initial_accumulator_value(0.1).fused(f));
       }},
      {"Adagrad maximize",
       [](const auto& p, auto f) { return std::make_unique<Adagrad>(p, AdagradOptions(0.05).maximize(true).fused(f)); }},
  };
}

double max_rel_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = b[i].abs().max().item<double>() + 1e-30;
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

/// Steps an optimizer made by `make` (its fused path, or the reference path) over the same random parameters of
/// `shapes` (of `dtype`, rounded from float32 for bfloat16/float16) for six steps; returns the parameters.
std::vector<at::Tensor> six_steps(const Factory& make, const std::vector<std::vector<int64_t>>& shapes,
                                  at::ScalarType dtype, bool fused) {
  const bool lowp = dtype == at::kBFloat16 || dtype == at::kHalf;
  auto params = random_params(shapes, lowp ? at::kFloat : dtype, 3);
  if (lowp) {
    for (auto& p : params) {
      p = p.detach().to(dtype).requires_grad_();
    }
  }
  auto opt = make(params, fused);
  for (int step = 0; step < 6; ++step) {
    set_grads(params, step);
    opt->step();
  }
  return params;
}

/// six_steps on the fused and on the reference path; returns (fused, reference).
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> fused_and_reference(
    const Factory& make, const std::vector<std::vector<int64_t>>& shapes, at::ScalarType dtype) {
  return {six_steps(make, shapes, dtype, true), six_steps(make, shapes, dtype, false)};
}

/// Both compute in float32 and round once per step; a float32 result one ulp apart can round to
/// neighbouring low-precision values, so one ulp of the parameter dtype (2^-7 / 2^-10 relative) is allowed.
void check_within_one_lowp_ulp(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  const double ulp = a[0].scalar_type() == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto fa = a[i].detach().to(at::kFloat);
    const auto fb = b[i].detach().to(at::kFloat);
    INFO("parameter " << i);
    CHECK(((fa - fb).abs() <= fb.abs() * ulp + 1e-30).all().item<bool>());
  }
}

void resume(const torch::optim::Optimizer& from, const std::vector<at::Tensor>& a, torch::optim::Optimizer& to,
            const std::vector<at::Tensor>& b);

/// Runs golden case `c` of optim.toml's setup (shapes, initial values, two groups) with parameters of
/// `dtype`, comparing every recorded step with the oracle's values within `tol` (relative; a negative `tol`
/// compares nothing), for the case's steps or `steps` when positive; after step `resume_at` (when positive)
/// it continues on copies of the parameters with a fresh optimizer that loaded the state saved then.
/// Returns the parameters and the optimizer for further checks.
std::pair<std::vector<at::Tensor>, OptimizerPtr> run_golden_case(
    const toml::table& c, const toml::array& shapes, const toml::array& initial, const toml::array& groups,
    at::ScalarType dtype, Path path, double tol, int64_t steps = 0, int64_t resume_at = 0);

/// The golden setup's parameters (of `dtype`) and the optimizer of case `c` on them, on `path`.
std::pair<std::vector<at::Tensor>, OptimizerPtr> golden_setup(const toml::table& c, const toml::array& shapes,
                                                              const toml::array& initial, const toml::array& groups,
                                                              at::ScalarType dtype, Path path) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    params.push_back(torch::tensor(doubles_of(*initial.get(i)), torch::kFloat64)
                         .view(shape_of(*shapes.get(i)))
                         .to(dtype)
                         .requires_grad_());
  }
  std::vector<at::Tensor> g0;
  std::vector<at::Tensor> g1;
  for (const auto& idx : *groups.get(0)->as_array()) {
    g0.push_back(params[static_cast<size_t>(idx.value<int64_t>().value())]);
  }
  for (const auto& idx : *groups.get(1)->as_array()) {
    g1.push_back(params[static_cast<size_t>(idx.value<int64_t>().value())]);
  }
  auto opt = make_case_optimizer(c, g0, g1, path);
  return {std::move(params), std::move(opt)};
}

std::pair<std::vector<at::Tensor>, OptimizerPtr> run_golden_case(
    const toml::table& c, const toml::array& shapes, const toml::array& initial, const toml::array& groups,
    at::ScalarType dtype, Path path, double tol, int64_t steps, int64_t resume_at) {
  auto [params, opt] = golden_setup(c, shapes, initial, groups, dtype, path);
  const auto& records = *c["record"].as_array();
  size_t next = 0;
  const bool compare = tol >= 0;
  if (steps <= 0) {
    steps = c["steps"].value<int64_t>().value();
  }
  for (int64_t step = 1; step <= steps; ++step) {
    opt->zero_grad();
    trainkit::test::golden_loss(params).backward();
    opt->step();
    if (step == resume_at) {
      auto [fresh, resumed] = golden_setup(c, shapes, initial, groups, dtype, path);
      resume(*opt, params, *resumed, fresh);
      params = std::move(fresh);
      opt = std::move(resumed);
    }
    if (compare && next < records.size() &&
        (*records.get(next)->as_table())["step"].value<int64_t>().value() == step) {
      const auto& rec = *records.get(next)->as_table();
      INFO("step " << step);
      const auto& want = *rec["params"].as_array();
      for (size_t i = 0; i < params.size(); ++i) {
        INFO("parameter " << i);
        REQUIRE(params[i].scalar_type() == dtype);
        require_close_values(params[i].to(torch::kFloat64), doubles_of(*want.get(i)), tol);
      }
      for (const auto& [key, node] : rec) {  // recorded state beside the parameters (ASGD's ax)
        const std::string k(key.str());
        for (size_t i = 0; k != "step" && k != "params" && i < params.size(); ++i) {
          INFO("state " << k << " of parameter " << i);
          require_close_values(saved_state(*opt, params[i], k).to(torch::kFloat64),
                               doubles_of(*node.as_array()->get(i)), tol);
        }
      }
      ++next;
    }
  }
  REQUIRE((!compare || next == records.size()));
  return {std::move(params), std::move(opt)};
}

/// Resumes `from` (over `a`) in `to` (over `b`): `b` takes the values of `a`, and `to` the state `from` saves.
void resume(const torch::optim::Optimizer& from, const std::vector<at::Tensor>& a, torch::optim::Optimizer& to,
            const std::vector<at::Tensor>& b) {
  std::ostringstream saved;
  {
    torch::serialize::OutputArchive archive;
    from.save(archive);
    archive.save_to(saved);
  }
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < a.size(); ++i) {
      b[i].copy_(a[i]);
    }
  }
  std::istringstream in(saved.str());
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  to.load(archive);
}

/// Calls `fn(case, shapes, initial, groups)` (the case and the file's setup) for every case of optim.toml,
/// each in its own section named by the case and `path`; `skip(optimizer name)` leaves a case out.
using GoldenCaseFn = std::function<void(const toml::table& c, const toml::array& shapes, const toml::array& initial,
                                        const toml::array& groups)>;
void for_golden_cases(const std::string& path, const std::function<bool(const std::string&)>& skip,
                      const GoldenCaseFn& fn) {
  const auto& g = trainkit::test::golden("optim.toml");
  int case_index = 0;
  for (const auto& node : *g["case"].as_array()) {
    const auto& c = *node.as_table();
    const std::string name = c["optimizer"].value<std::string>().value();
    if (!skip(name)) {
      DYNAMIC_SECTION("case " << case_index << " (" << name << ")" << path) {
        fn(c, *g["shapes"].as_array(), *g["initial"].as_array(), *g["groups"].as_array());
      }
    }
    ++case_index;
  }
}

bool no_skip(const std::string& /*name*/) { return false; }

}  // namespace

TEST_CASE("optimizers match torch.optim and timm trajectories (float64, two param groups)",
          "[optim][golden][adam][sgd][lars][lamb][radam][nadam][adamax][lion][adafactor]") {
  for (const Path path : {Path::fused, Path::reference, Path::foreach, Path::aten}) {
    for_golden_cases(
        path_name(path), [&](const std::string& name) { return !has_path(name, path); },
        [&](const auto& c, const auto& shapes, const auto& initial, const auto& groups) {
          run_golden_case(c, shapes, initial, groups, at::kDouble, path, 1e-9);
        });
  }
}

TEST_CASE("golden trajectories go on through a state_dict saved and loaded in the middle (reference path)",
          "[optim][golden][serialize]") {
  for_golden_cases("", no_skip, [](const auto& c, const auto& shapes, const auto& initial, const auto& groups) {
    run_golden_case(c, shapes, initial, groups, at::kDouble, Path::reference, 1e-9, 0, 7);
  });
}

TEST_CASE("the foreach path equals the reference path to 1 ulp (float64, 20 steps, every golden case)",
          "[optim][foreach]") {
  const auto no_foreach = [](const std::string& name) { return !has_path(name, Path::foreach); };
  for_golden_cases("", no_foreach, [](const auto& c, const auto& shapes, const auto& initial, const auto& groups) {
    const auto foreach = run_golden_case(c, shapes, initial, groups, at::kDouble, Path::foreach, -1, 20).first;
    const auto reference = run_golden_case(c, shapes, initial, groups, at::kDouble, Path::reference, -1, 20).first;
    for (size_t i = 0; i < foreach.size(); ++i) {
      INFO("parameter " << i);
      const at::Tensor a = foreach[i].detach();
      const at::Tensor b = reference[i].detach();
      const at::Tensor inf = torch::full_like(b, std::numeric_limits<double>::infinity());
      const at::Tensor within = (a == b) | (a == at::nextafter(b, inf)) | (a == at::nextafter(b, -inf));
      CHECK(within.all().item<bool>());
    }
  });
}

TEST_CASE("a state_dict round trip after 10 steps continues the trajectory (float64, every golden case)",
          "[optim][golden][serialize]") {
  // 10 steps, save, load into a fresh optimizer over copies of the parameters, 10 more: bitwise the same
  // as 20 steps uninterrupted (the default path of each optimizer: fused where it has a fused kernel).
  for_golden_cases("", no_skip, [](const auto& c, const auto& shapes, const auto& initial, const auto& groups) {
    const Path path = has_path(c["optimizer"].template value<std::string>().value(), Path::fused) ? Path::fused
                                                                                                   : Path::reference;
    const auto straight = run_golden_case(c, shapes, initial, groups, at::kDouble, path, -1, 20).first;
    auto [a, first] = run_golden_case(c, shapes, initial, groups, at::kDouble, path, -1, 10);
    auto [b, second] = golden_setup(c, shapes, initial, groups, at::kDouble, path);
    resume(*first, a, *second, b);
    for (int step = 11; step <= 20; ++step) {
      second->zero_grad();
      trainkit::test::golden_loss(b).backward();
      second->step();
    }
    for (size_t i = 0; i < b.size(); ++i) {
      INFO("parameter " << i);
      CHECK(torch::equal(b[i], straight[i]));
    }
  });
}

TEST_CASE("ATen's fused kernels equal the reference path (float64, 20 steps, every golden case of Adam, AdamW, SGD)",
          "[optim][aten_fused]") {
  // ATen's kernels compute the same formulas in another order (e.g. the bias corrections folded into one
  // step size), so equality is to a few ulp, not bitwise: measured at most 5.1e-16 of the tensor's largest
  // magnitude over the 21 cases.
  for_golden_cases(
      "", [](const std::string& name) { return !has_path(name, Path::aten); },
      [](const auto& c, const auto& shapes, const auto& initial, const auto& groups) {
        const auto aten = run_golden_case(c, shapes, initial, groups, at::kDouble, Path::aten, -1, 20).first;
        const auto reference = run_golden_case(c, shapes, initial, groups, at::kDouble, Path::reference, -1, 20).first;
        CHECK(max_rel_diff(aten, reference) <= 1e-15);
      });
}

TEST_CASE("aten_fused: chosen for fused = true off the CPU, or when asked for, and the kernel runs exactly then",
          "[optim][aten_fused]") {
  const std::vector<at::Tensor> cpu = {torch::zeros({3})};
  const std::vector<at::Tensor> meta = {torch::empty({3}, torch::TensorOptions().device(torch::kMeta))};
  CHECK_FALSE(internal::use_aten_fused(std::nullopt, std::nullopt, std::nullopt, meta, "Adam", 0));
  CHECK_FALSE(internal::use_aten_fused(std::nullopt, true, std::nullopt, cpu, "Adam", 0));  // trainkit's kernel
  CHECK(internal::use_aten_fused(std::nullopt, true, std::nullopt, meta, "Adam", 0));       // as on CUDA
  CHECK_FALSE(internal::use_aten_fused(false, true, std::nullopt, meta, "Adam", 0));
  CHECK(internal::use_aten_fused(true, std::nullopt, false, cpu, "Adam", 0));
  CHECK_THROWS_MATCHES(internal::use_aten_fused(true, std::nullopt, true, cpu, "Sgd", 1), std::invalid_argument,
                       WhatContains("Sgd: param group 1 sets both aten_fused=true and foreach=true"));
  CHECK_THROWS_MATCHES(internal::use_aten_fused(true, false, std::nullopt, cpu, "AdamW", 0), std::invalid_argument,
                       WhatContains("AdamW: param group 0 sets aten_fused=true but fused=false"));
  auto p = torch::ones({4}).requires_grad_();
  p.mutable_grad() = torch::ones({4});
  for (const bool aten : {true, false}) {
    const int64_t ops = count_ops("aten::_fused_", [&] {
      for (const char* name : {"adam", "adamw", "sgd"}) {
        trainkit::ArgTable args = {{"lr", trainkit::ArgValue(0.1)}, {"aten_fused", trainkit::ArgValue(aten)}};
        if (std::string(name) == "sgd") {
          trainkit::set_arg(args, "momentum", trainkit::ArgValue(0.9));
        }
        trainkit::ArgReader reader(args, "test");
        auto opt = make_optimizer(parse_optimizer(name, reader), std::vector<at::Tensor>{p});
        opt->step();
        opt->step();
      }
    });
    INFO("aten_fused = " << aten);
    CHECK(ops == (aten ? 6 : 0));
  }
  // Tensors the kernels cannot take are named: trainkit keeps float32 state for bfloat16 parameters.
  auto bf = torch::zeros({4}, torch::TensorOptions().dtype(torch::kBFloat16).requires_grad(true));
  bf.mutable_grad() = torch::ones({4}, torch::kBFloat16);
  Adam lowp({bf}, AdamOptions(0.1).aten_fused(true));
  CHECK_THROWS_MATCHES(lowp.step(), std::invalid_argument,
                       WhatContains("Adam: param group 0 cannot use ATen's fused kernel: the parameters, gradients "
                                    "and state mix BFloat16 and Float"));
  Sgd both({p}, SgdOptions(0.1).aten_fused(true).foreach(true));
  CHECK_THROWS_MATCHES(both.step(), std::invalid_argument,
                       WhatContains("Sgd: param group 0 sets both aten_fused=true and foreach=true"));
}

TEST_CASE("a checkpoint moves between ATen's fused kernels and the other paths", "[optim][aten_fused][serialize]") {
  // 4 steps on one path, save, load into an optimizer on the other, 5 more: the same as 9 steps on the
  // second path alone to a few ulp (the paths differ by rounding only), and the step count carries over.
  // On ATen's kernels the steps take a found_inf on the device (the second one set: skipped), so that the
  // count lives only there.
  const std::vector<std::vector<int64_t>> shapes{{6, 4}, {4}, {3, 3}};
  using Make = std::function<OptimizerPtr(const std::vector<at::Tensor>&, bool aten)>;
  const std::vector<std::pair<std::string, Make>> makers{
      {"Adam", [](const auto& p, bool aten) {
         return std::make_unique<Adam>(p, AdamOptions(1e-2).weight_decay(0.1).amsgrad(true).aten_fused(aten));
       }},
      {"AdamW", [](const auto& p, bool aten) { return std::make_unique<AdamW>(p, AdamWOptions(1e-2).aten_fused(aten)); }},
      {"Sgd", [](const auto& p, bool aten) {
         return std::make_unique<Sgd>(p, SgdOptions(0.05).momentum(0.9).dampening(0.2).aten_fused(aten));
       }},
  };
  for (const auto& [name, make] : makers) {
    for (const bool first_aten : {true, false}) {
      DYNAMIC_SECTION(name << (first_aten ? " aten -> reference" : " reference -> aten")) {
        auto a = random_params(shapes, at::kDouble, 5);
        auto b = clones(a);
        auto c = clones(a);
        auto first = make(a, first_aten);
        auto straight = make(c, !first_aten);
        for (int step = 0; step < 4; ++step) {
          set_grads(a, step);
          set_grads(c, step);
          const bool skip = first_aten && step == 1;
          if (first_aten) {
            dynamic_cast<ScaledStep&>(*first).step_found_inf({}, torch::full({}, skip ? 1.0f : 0.0f));
          } else {
            first->step();
          }
          if (!skip) {
            straight->step();
          }
        }
        auto second = make(b, !first_aten);
        resume(*first, a, *second, b);
        if (auto* adam = dynamic_cast<AdamParamState*>(second->state().at(b[0].unsafeGetTensorImpl()).get())) {
          CHECK(adam->step() == (first_aten ? 3 : 4));
        }
        for (int step = 4; step < 9; ++step) {
          set_grads(b, step);
          set_grads(c, step);
          second->step();
          straight->step();
        }
        CHECK(max_rel_diff(b, c) <= 1e-14);
      }
    }
  }
}

TEST_CASE("foreach: chosen for tensors off the CPU unless fused is asked for, and not with fused = true",
          "[optim][foreach]") {
  const std::vector<at::Tensor> cpu = {torch::zeros({3})};
  const std::vector<at::Tensor> meta = {torch::empty({3}, torch::TensorOptions().device(torch::kMeta))};
  CHECK_FALSE(internal::use_foreach(std::nullopt, std::nullopt, cpu, "Adam", 0));
  CHECK(internal::use_foreach(std::nullopt, std::nullopt, meta, "Adam", 0));  // a CUDA group takes it likewise
  CHECK_FALSE(internal::use_foreach(std::nullopt, true, meta, "Adam", 0));
  CHECK_FALSE(internal::use_foreach(false, std::nullopt, meta, "Adam", 0));
  CHECK(internal::use_foreach(true, false, cpu, "Adam", 0));
  auto p = torch::ones({4}).requires_grad_();
  p.mutable_grad() = torch::ones({4});
  // The path taken is the one asked for: _foreach_* ops run on it and only on it.
  for (const bool foreach : {true, false}) {
    const int64_t ops = count_ops("aten::_foreach_", [&] {
      for (const char* name : {"adam", "sgd", "lars", "lamb"}) {
        trainkit::ArgTable args = {{"lr", trainkit::ArgValue(0.1)}, {"foreach", trainkit::ArgValue(foreach)}};
        if (std::string(name) != "adam" && std::string(name) != "lamb") {
          trainkit::set_arg(args, "momentum", trainkit::ArgValue(0.9));
        }
        trainkit::ArgReader reader(args, "test");
        make_optimizer(parse_optimizer(name, reader), std::vector<at::Tensor>{p})->step();
      }
    });
    INFO("foreach = " << foreach);
    CHECK((ops > 0) == foreach);
  }
  Adam both({p}, AdamOptions(0.1).fused(true).foreach(true));
  CHECK_THROWS_MATCHES(both.step(), std::invalid_argument,
                       WhatContains("Adam: param group 0 sets both fused=true and foreach=true"));
}

TEST_CASE("fused kernels equal the ATen reference path on many tensors and chunks", "[optim][fused]") {
  // 300 small tensors plus two that span many chunks, so chunking and threading are exercised.
  std::vector<std::vector<int64_t>> shapes(300, std::vector<int64_t>{7, 5});
  shapes.push_back({1000, 130});
  shapes.push_back({70001});
  for (const auto& [name, make] : factories()) {
    for (const auto dtype : {at::kFloat, at::kDouble}) {
      DYNAMIC_SECTION(name << (dtype == at::kFloat ? " float32" : " float64")) {
        const auto [a, b] = fused_and_reference(make, shapes, dtype);
        const double tol = dtype == at::kFloat ? 2e-5 : 1e-12;
        CHECK(max_rel_diff(a, b) <= tol);
      }
    }
  }
}

TEST_CASE("every kernel build and work split equals the reference path", "[optim][fused][kernels]") {
  // The baseline x86-64 kernels (what a CPU without AVX2/FMA/F16C runs, float16 conversion in software
  // included) and the three splits of for_each_even, on three threads so that splits cut tensors.
  using trainkit::detail::SplitMode;
  const int threads_before = at::get_num_threads();
  struct Restore {
    int threads;
    ~Restore() {
      trainkit::detail::set_kernel_choices(true, SplitMode::kContiguous);
      at::set_num_threads(threads);
    }
  } restore{threads_before};
  at::set_num_threads(3);
  std::vector<std::vector<int64_t>> shapes(40, std::vector<int64_t>{7, 5});
  shapes.push_back({70001});  // three chunks of kChunkGrain
  shapes.push_back({3});
  const std::vector<std::pair<const char*, SplitMode>> splits{
      {"chunks", SplitMode::kChunks}, {"contiguous", SplitMode::kContiguous}, {"per-tensor", SplitMode::kPerTensor}};
  for (const bool avx2 : {false, true}) {
    for (const auto& [split_name, split] : splits) {
      for (const auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
        const bool lowp = dtype == at::kBFloat16 || dtype == at::kHalf;
        const auto all = factories();
        // LARS's and LAMB's trust ratios come from norms of the rounded parameters, which the two paths
        // reduce in different orders: no one-ulp bound holds for them in bfloat16/float16.
        const std::vector<std::pair<std::string, Factory>> makers(all.begin(), lowp ? all.begin() + 5 : all.end());
        for (const auto& [name, make] : makers) {
          DYNAMIC_SECTION((avx2 ? "avx2 " : "baseline ") << split_name << " " << c10::toString(dtype) << " " << name) {
            trainkit::detail::set_kernel_choices(avx2, split);
            if (!avx2) {
              REQUIRE_FALSE(trainkit::detail::kernels_use_avx2());  // the switch reaches the dispatch
            }
            REQUIRE(trainkit::detail::split_mode() == split);
            // The reference path does not depend on the kernel build or split: computed once per optimizer and
            // dtype (Catch runs the test case's body once per section; the cache outlives the runs).
            // Never destroyed: no tensor is freed after LibTorch's own statics are gone.
            static auto* reference_of = new std::map<std::string, std::vector<at::Tensor>>();
            const std::string key = name + " " + c10::toString(dtype);
            if (reference_of->count(key) == 0) {
              (*reference_of)[key] = six_steps(make, shapes, dtype, false);
            }
            const auto a = six_steps(make, shapes, dtype, true);
            const auto& b = reference_of->at(key);
            if (lowp) {
              check_within_one_lowp_ulp(a, b);
            } else {
              CHECK(max_rel_diff(a, b) <= (dtype == at::kFloat ? 2e-5 : 1e-12));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("bfloat16/float16 parameters with float32 state match torch.optim's fused optimizers on float32 masters",
          "[optim][golden][lowp]") {
  // The oracle (scripts/golden_optim.py) is PyTorch's own fused AdamW/Adam/SGD on float32 copies rounded to
  // the parameter dtype after every step; its fused and single-tensor paths agree bit for bit there, and so
  // must ours: every recorded value is compared exactly.
  const auto& base = trainkit::test::golden("optim.toml");
  const auto& g = trainkit::test::golden("optim_lowp.toml");
  const auto& shapes = *base["shapes"].as_array();
  const auto& initial = *base["initial"].as_array();
  const auto& groups = *base["groups"].as_array();
  int case_index = 0;
  for (const auto& node : *g["case"].as_array()) {
    const auto& c = *node.as_table();
    const std::string dname = c["dtype"].value<std::string>().value();
    const auto dtype = dname == "bfloat16" ? at::kBFloat16 : at::kHalf;
    for (const Path path : {Path::fused, Path::reference, Path::foreach}) {
      DYNAMIC_SECTION("case " << case_index << " (" << c["optimizer"].value<std::string>().value() << ", " << dname
                              << ")" << path_name(path)) {
        const auto [params, opt] = run_golden_case(c, shapes, initial, groups, dtype, path, 0.0);
        // The state is float32.
        for (const auto& p : params) {
          auto* state = opt->state().at(p.unsafeGetTensorImpl()).get();
          if (auto* adam = dynamic_cast<AdamParamState*>(state)) {
            CHECK(adam->exp_avg().scalar_type() == at::kFloat);
          } else if (auto* sgd = dynamic_cast<SgdParamState*>(state)) {
            CHECK(sgd->momentum_buffer().scalar_type() == at::kFloat);
          }
        }
      }
    }
    ++case_index;
  }
}

TEST_CASE("fused kernels on bfloat16/float16 parameters equal the float32 reference path", "[optim][fused][lowp]") {
  std::vector<std::vector<int64_t>> shapes(50, std::vector<int64_t>{7, 5});
  shapes.push_back({1000, 130});
  shapes.push_back({70001});
  const std::vector<std::pair<std::string, Factory>> makers{factories()[0], factories()[1], factories()[2],
                                                            factories()[3], factories()[4]};
  for (const auto& [name, make] : makers) {
    for (const auto dtype : {at::kBFloat16, at::kHalf}) {
      DYNAMIC_SECTION(name << (dtype == at::kBFloat16 ? " bfloat16" : " float16")) {
        const auto [a, b] = fused_and_reference(make, shapes, dtype);
        check_within_one_lowp_ulp(a, b);
      }
    }
  }
}

TEST_CASE("Adam state kept in the bfloat16/float16 parameters' dtype: fused equals the reference path",
          "[optim][fused][lowp]") {
  // As torch.optim keeps it (e.g. a state loaded from PyTorch): both paths compute in float32 and round p, m
  // and v once per step.
  const std::vector<std::vector<int64_t>> shapes{{40, 30}, {70001}, {3}};
  const std::vector<std::pair<std::string, Factory>> makers{factories()[1], factories()[2]};
  for (const auto& [name, make] : makers) {
    for (const auto dtype : {at::kBFloat16, at::kHalf}) {
      DYNAMIC_SECTION(name << (dtype == at::kBFloat16 ? " bfloat16" : " float16")) {
        auto a = random_params(shapes, at::kFloat, 4);
        for (auto& p : a) {
          p = p.detach().to(dtype).requires_grad_();
        }
        auto b = clones(a);
        auto fused = make(a, true);
        auto reference = make(b, false);
        for (const auto& pair : {std::make_pair(fused.get(), &a), std::make_pair(reference.get(), &b)}) {
          for (const auto& p : *pair.second) {
            auto s = std::make_unique<AdamParamState>();
            s->exp_avg(torch::zeros_like(p));
            s->exp_avg_sq(torch::zeros_like(p));
            pair.first->state()[p.unsafeGetTensorImpl()] = std::move(s);
          }
        }
        for (int step = 0; step < 6; ++step) {
          set_grads(a, step);
          set_grads(b, step);
          fused->step();
          reference->step();
        }
        const double ulp = dtype == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
        for (size_t i = 0; i < a.size(); ++i) {
          const auto fa = a[i].detach().to(at::kFloat);
          const auto fb = b[i].detach().to(at::kFloat);
          INFO("parameter " << i);
          CHECK(((fa - fb).abs() <= fb.abs() * ulp + 1e-30).all().item<bool>());
          auto* state = dynamic_cast<AdamParamState*>(fused->state().at(a[i].unsafeGetTensorImpl()).get());
          REQUIRE(state != nullptr);
          CHECK(state->exp_avg().scalar_type() == dtype);
        }
      }
    }
  }
}

TEST_CASE("fused results do not depend on the number of threads", "[optim][fused][threads]") {
  // Shapes whose even split puts thread boundaries inside tensors and across them.
  std::vector<std::vector<int64_t>> shapes{{3}, {100003}, {17, 5}, {70001}, {64}, {40000}};
  const int before = at::get_num_threads();
  for (const auto& [name, make] : factories()) {
    DYNAMIC_SECTION(name) {
      std::vector<std::vector<at::Tensor>> results;
      for (const int threads : {1, 2, 3}) {
        at::set_num_threads(threads);
        auto a = random_params(shapes, at::kFloat, 11);
        auto opt = make(a, true);
        for (int step = 0; step < 3; ++step) {
          set_grads(a, step);
          opt->step();
        }
        results.push_back(a);
      }
      at::set_num_threads(before);
      for (size_t r = 1; r < results.size(); ++r) {
        for (size_t i = 0; i < shapes.size(); ++i) {
          INFO("run " << r << ", parameter " << i);
          CHECK(torch::equal(results[0][i], results[r][i]));
        }
      }
    }
  }
  at::set_num_threads(before);
}

TEST_CASE("save, load and keep stepping equals uninterrupted stepping", "[optim][serialize]") {
  const std::vector<std::vector<int64_t>> shapes{{6, 4}, {4}, {3, 3}};
  for (const auto& [name, make] : factories()) {
    DYNAMIC_SECTION(name) {
      auto a = random_params(shapes, at::kDouble, 5);
      auto b = clones(a);
      auto first = make(a, std::nullopt);
      for (int step = 0; step < 4; ++step) {
        set_grads(a, step);
        first->step();
      }
      // A fresh optimizer on copies of the parameters as they are now, state loaded from the archive.
      auto second = make(b, std::nullopt);
      resume(*first, a, *second, b);
      for (int step = 4; step < 9; ++step) {
        set_grads(a, step);
        set_grads(b, step);
        first->step();
        second->step();
      }
      for (size_t i = 0; i < a.size(); ++i) {
        CHECK(torch::equal(a[i], b[i]));
      }
    }
  }
}

TEST_CASE("every optimizer fits a small regression", "[optim][convergence]") {
  torch::manual_seed(0);
  const auto x = torch::randn({256, 8});
  const auto w_true = torch::randn({8, 1});
  const auto y = x.mm(w_true) + 0.5;
  const std::vector<std::pair<std::string, std::function<OptimizerPtr(std::vector<at::Tensor>)>>> makers{
      {"Adam", [](auto p) { return std::make_unique<Adam>(p, AdamOptions(0.05)); }},
      {"AdamW", [](auto p) { return std::make_unique<AdamW>(p, AdamWOptions(0.05).weight_decay(1e-4)); }},
      {"Sgd", [](auto p) { return std::make_unique<Sgd>(p, SgdOptions(0.05).momentum(0.9)); }},
      {"Lars", [](auto p) { return std::make_unique<Lars>(p, LarsOptions(1.0).momentum(0.9).always_adapt(true).trust_coefficient(0.01)); }},
      {"Lamb", [](auto p) { return std::make_unique<Lamb>(p, LambOptions(0.05).weight_decay(0)); }},
      {"RAdam", [](auto p) { return std::make_unique<RAdam>(p, RAdamOptions(0.05)); }},
      {"NAdam", [](auto p) { return std::make_unique<NAdam>(p, NAdamOptions(0.05)); }},
      {"Adamax", [](auto p) { return std::make_unique<Adamax>(p, AdamaxOptions(0.05)); }},
      {"Lion", [](auto p) { return std::make_unique<Lion>(p, LionOptions(0.02)); }},
      {"Adafactor", [](auto p) { return std::make_unique<Adafactor>(p, AdafactorOptions(0.05).beta1(0.9)); }},
  };
  for (const auto& [name, make] : makers) {
    DYNAMIC_SECTION(name) {
      torch::manual_seed(1);
      auto w = (0.1 * torch::randn({8, 1})).requires_grad_();
      auto b = torch::zeros({1}).requires_grad_();
      auto opt = make({w, b});
      const auto loss_fn = [&] { return (x.mm(w) + b - y).pow(2).mean(); };
      const double start = loss_fn().item<double>();
      double last = start;
      std::vector<double> lr0;
      for (const auto& group : opt->param_groups()) {
        lr0.push_back(group.options().get_lr());
      }
      for (int step = 0; step < 300; ++step) {
        for (size_t i = 0; i < lr0.size(); ++i) {  // linear decay to 0, so LARS's relative steps shrink too
          opt->param_groups()[i].options().set_lr(lr0[i] * (1.0 - step / 300.0));
        }
        last = opt->step([&] {
                      opt->zero_grad();
                      auto loss = loss_fn();
                      loss.backward();
                      return loss;
                    })
                   .item<double>();
      }
      INFO(name << ": loss " << start << " -> " << last);
      CHECK(last < start * 1e-2);
    }
  }
}

TEST_CASE("invalid hyperparameters and inputs are rejected with the name and value", "[optim][validation]") {
  auto p = torch::zeros({3}, torch::requires_grad());
  CHECK_THROWS_MATCHES(Adam({p}, AdamOptions(-1.0)), std::invalid_argument,
                       WhatContains("Adam: lr: expected a number >= 0, got -1"));
  CHECK_NOTHROW(Adam({p}, AdamOptions(0.0)));  // PyTorch takes lr = 0
  CHECK_THROWS_MATCHES(Adam({p}, AdamOptions().betas({1.0, 0.999})), std::invalid_argument,
                       WhatContains("Adam: betas: expected"));
  CHECK_THROWS_MATCHES(AdamW({p}, AdamWOptions().betas({0.9, -0.1})), std::invalid_argument,
                       WhatContains("-0.1"));
  CHECK_THROWS_MATCHES(AdamW({p}, AdamWOptions().eps(-1e-8)), std::invalid_argument, WhatContains("eps"));
  CHECK_THROWS_MATCHES(Sgd({p}, SgdOptions(0.1).nesterov(true)), std::invalid_argument,
                       WhatContains("nesterov momentum requires a momentum > 0"));
  CHECK_THROWS_MATCHES(Lars({p}, LarsOptions().weight_decay(-1)), std::invalid_argument,
                       WhatContains("weight_decay: expected a number >= 0, got -1"));
  CHECK_THROWS_MATCHES(Lamb({p}, LambOptions().max_grad_norm(-1.0)), std::invalid_argument,
                       WhatContains("max_grad_norm"));
  CHECK_NOTHROW(Lamb({p}, LambOptions().max_grad_norm(0.0)));  // 0 = no clipping, as a config's 0
  // A bad value in one param group is caught too.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p}, std::make_unique<SgdOptions>(SgdOptions(-0.5)));
  CHECK_THROWS_MATCHES(Sgd(groups, SgdOptions(0.1)), std::invalid_argument, WhatContains("-0.5"));
  // Options of another optimizer type in a group are named, not misread.
  std::vector<torch::optim::OptimizerParamGroup> foreign;
  foreign.emplace_back(std::vector<at::Tensor>{p}, std::make_unique<torch::optim::AdamOptions>(1e-3));
  CHECK_THROWS_MATCHES(Adam(foreign, AdamOptions()), std::invalid_argument,
                       WhatContains("param group 0 has options of another optimizer"));

  SECTION("fused=true on tensors the kernel cannot take") {
    // LARS's trust-ratio kernel takes float32/float64 only (Adam, AdamW and Sgd also take bfloat16/float16).
    auto half = torch::zeros({4}, torch::TensorOptions().dtype(torch::kBFloat16).requires_grad(true));
    half.mutable_grad() = torch::ones({4}, torch::kBFloat16);
    Lars opt({half}, LarsOptions(0.1).always_adapt(true).fused(true));
    CHECK_THROWS_WITH(opt.step(), Catch::Matchers::Contains("fused=true but param group 0") &&
                                      Catch::Matchers::Contains("BFloat16"));
    Lars auto_path({half}, LarsOptions(0.1).always_adapt(true));
    CHECK_NOTHROW(auto_path.step());  // unset: the reference path takes bfloat16
    // Gradients of another dtype than their parameters are named.
    auto bf = torch::zeros({4}, torch::TensorOptions().dtype(torch::kBFloat16).requires_grad(true));
    bf.mutable_grad() = torch::ones({4}, torch::kFloat);
    Adam mixed({bf}, AdamOptions().fused(true));
    CHECK_THROWS_WITH(mixed.step(), Catch::Matchers::Contains("mix BFloat16 and Float"));
  }
  SECTION("sparse gradients") {
    auto q = torch::zeros({4}, torch::requires_grad());
    q.mutable_grad() = torch::zeros({4}).to_sparse();
    Lamb opt({q}, LambOptions().max_grad_norm(std::nullopt));
    CHECK_THROWS_WITH(opt.step(), Catch::Matchers::Contains("parameter 0 of param group 0 has a sparse gradient"));
  }
}

TEST_CASE("Adafactor's lr: the relative step when unset, reported by get_lr and not driven by set_lr, as in timm",
          "[optim][adafactor][sched]") {
  auto p = torch::full({3}, 0.5, torch::kFloat64).requires_grad_();
  Adafactor opt({p});
  auto& o = opt.param_groups()[0].options();
  CHECK(o.get_lr() == 0.0);
  p.mutable_grad() = torch::ones_like(p);
  opt.step();
  // min(1e-2, 1/sqrt(1)) * max(eps_scale, RMS(p) = 0.5); the update g/sqrt(v) is 1 everywhere (RMS 1: no clip).
  CHECK(o.get_lr() == Approx(0.005));
  CHECK(p[0].item<double>() == Approx(0.495));
  o.set_lr(1.0);  // a scheduler's write, overwritten by the next step (timm's param_group['lr'])
  opt.step();
  CHECK(o.get_lr() == Approx(0.00495));
  CHECK(p[0].item<double>() == Approx(0.495 - 0.00495));

  auto q = torch::zeros({3}, torch::requires_grad());
  Adafactor external({q}, AdafactorOptions(0.1));
  auto& e = external.param_groups()[0].options();
  CHECK(e.get_lr() == 0.1);
  e.set_lr(0.05);
  CHECK(static_cast<AdafactorOptions&>(e).lr() == 0.05);
  CHECK_THROWS_MATCHES(Adafactor({q}, AdafactorOptions(0.1).warmup_init(true)), std::invalid_argument,
                       WhatContains("Adafactor: warmup_init requires the relative step (lr unset)"));
  CHECK_THROWS_MATCHES(Lion({q}, LionOptions().betas({0.9, 1.0})), std::invalid_argument,
                       WhatContains("Lion: betas: expected"));
}

TEST_CASE("schedulers drive trainkit optimizers, momentum and beta1 included", "[optim][sched]") {
  auto p = torch::zeros({2}, torch::requires_grad());
  Adam adam({p}, AdamOptions(1e-3));
  trainkit::sched::OneCycleLR adam_cycle(adam, trainkit::sched::OneCycleLROptions({0.01}).total_steps(10));
  CHECK(std::get<0>(static_cast<AdamOptions&>(adam.param_groups()[0].options()).betas()) == Approx(0.95));
  CHECK(adam.param_groups()[0].options().get_lr() == Approx(0.01 / 25));
  Sgd sgd({p}, SgdOptions(0.1).momentum(0.9));
  trainkit::sched::OneCycleLR sgd_cycle(sgd, trainkit::sched::OneCycleLROptions({0.1}).total_steps(10));
  CHECK(static_cast<SgdOptions&>(sgd.param_groups()[0].options()).momentum() == Approx(0.95));
  // The manual adjustment of one group's LR (the notes' one-liner) works as in LibTorch.
  sgd.param_groups()[0].options().set_lr(0.001);
  CHECK(static_cast<SgdOptions&>(sgd.param_groups()[0].options()).lr() == 0.001);
}

TEST_CASE("weight_decay_param_groups keeps biases and norm weights out of decay", "[optim][lars]") {
  torch::nn::Sequential net(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3), torch::nn::Linear(3, 2));
  const auto groups = weight_decay_param_groups(net->parameters(), LarsOptions(0.1).weight_decay(1e-4));
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].params().size() == 4);  // 2 biases + norm weight and bias
  CHECK(static_cast<const LarsOptions&>(groups[0].options()).weight_decay() == 0.0);
  CHECK(groups[1].params().size() == 2);
  CHECK(static_cast<const LarsOptions&>(groups[1].options()).weight_decay() == 1e-4);
  Lars opt(groups, LarsOptions(0.1));
  CHECK(opt.param_groups().size() == 2);
}

TEST_CASE("step_scaled unscales inside the kernel and skips on overflow", "[optim][amp]") {
  const std::vector<std::vector<int64_t>> shapes{{40, 3}, {3}};
  for (const auto& [name, make] : factories()) {
    for (const bool fused : {true, false}) {
      DYNAMIC_SECTION(name << (fused ? " fused" : " reference")) {
        auto a = random_params(shapes, at::kFloat, 9);
        auto b = clones(a);
        auto opt_a = make(a, fused);
        auto opt_b = make(b, fused);
        auto* scaled = dynamic_cast<ScaledStep*>(opt_a.get());
        REQUIRE(scaled != nullptr);
        const auto inv_scale = torch::full({}, 1.0f / 1024.0f);
        for (int step = 0; step < 3; ++step) {
          set_grads(a, step);
          set_grads(b, step);
          for (auto& p : a) {
            p.mutable_grad().mul_(1024.0f);  // scaled gradients, as GradScaler leaves them
          }
          scaled->step_scaled(inv_scale, torch::zeros({}));
          opt_b->step();
        }
        CHECK(max_rel_diff(a, b) <= 1e-6);
        const auto before = clones(a);
        scaled->step_scaled(inv_scale, torch::ones({}));
        for (size_t i = 0; i < a.size(); ++i) {
          CHECK(torch::equal(a[i], before[i]));
        }
      }
    }
  }
}

TEST_CASE("step_found_inf: ATen's fused kernels divide by the scale and skip on the device", "[optim][amp][aten_fused]") {
  // As PyTorch's fused optimizers under GradScaler: a clean scaled step equals the unscaled step, a step with
  // found_inf set leaves parameters, state and the step count as they were.
  const std::vector<std::vector<int64_t>> shapes{{40, 3}, {3}};
  using Make = std::function<OptimizerPtr(const std::vector<at::Tensor>&)>;
  const std::vector<std::pair<std::string, Make>> makers{
      {"Adam", [](const auto& p) { return std::make_unique<Adam>(p, AdamOptions(1e-2).weight_decay(0.1).aten_fused(true)); }},
      {"AdamW amsgrad", [](const auto& p) {
         return std::make_unique<AdamW>(p, AdamWOptions(1e-2).amsgrad(true).aten_fused(true));
       }},
      // A first step skipped leaves a zero momentum buffer, which the next step's b = 0.9 b + g makes g, as a
      // first step does (with dampening d it would be (1 - d) g: see docs/optimizers.md).
      {"Sgd nesterov", [](const auto& p) {
         return std::make_unique<Sgd>(p, SgdOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3).aten_fused(true));
       }},
  };
  for (const auto& [name, make] : makers) {
    DYNAMIC_SECTION(name) {
      auto a = random_params(shapes, at::kFloat, 9);
      auto b = clones(a);
      auto opt_a = make(a);
      auto opt_b = make(b);
      auto* scaled = dynamic_cast<ScaledStep*>(opt_a.get());
      REQUIRE(scaled != nullptr);
      REQUIRE(scaled->takes_found_inf());
      const auto scale = torch::full({}, 1024.0f);
      for (int step = 0; step < 4; ++step) {
        set_grads(a, step);
        set_grads(b, step);
        for (auto& p : a) {
          p.mutable_grad().mul_(1024.0f);  // scaled gradients, as GradScaler leaves them
        }
        if (step == 0 || step == 2) {  // skipped, the first step included: nothing changes
          const auto before = clones(a);
          scaled->step_found_inf(scale, torch::ones({}));
          for (size_t i = 0; i < a.size(); ++i) {
            CHECK(torch::equal(a[i], before[i]));
          }
          continue;
        }
        scaled->step_found_inf(scale, torch::zeros({}));
        opt_b->step();
      }
      // Two clean steps each: equal to the last bit (dividing by a power of two is exact).
      for (size_t i = 0; i < a.size(); ++i) {
        CHECK(torch::equal(a[i], b[i]));
      }
    }
  }
  // An optimizer with a group off ATen's kernels cannot skip on the device.
  auto p = torch::ones({4}).requires_grad_();
  p.mutable_grad() = torch::ones({4});
  Adam plain({p}, AdamOptions(0.1));
  CHECK_FALSE(plain.takes_found_inf());
  CHECK_THROWS_AS(plain.step_found_inf(torch::ones({}), torch::zeros({})), std::logic_error);
}

TEST_CASE("on CUDA, fused = true takes ATen's fused kernels and equals their CPU kernels", "[optim][aten_fused][cuda]") {
  if (!torch::cuda::is_available()) {
    TRAINKIT_SKIP("no CUDA device: ATen's CUDA fused kernels need a GPU");
  }
  const std::vector<std::vector<int64_t>> shapes{{40, 3}, {3}, {1000}};
  using Make = std::function<OptimizerPtr(const std::vector<at::Tensor>&, bool cuda)>;
  const std::vector<std::pair<std::string, Make>> makers{
      // On CUDA `fused = true` alone chooses ATen's kernels; on the CPU `aten_fused = true` does.
      {"Adam", [](const auto& p, bool cuda) {
         return std::make_unique<Adam>(p, cuda ? AdamOptions(1e-2).weight_decay(0.1).fused(true)
                                               : AdamOptions(1e-2).weight_decay(0.1).aten_fused(true));
       }},
      {"AdamW amsgrad", [](const auto& p, bool cuda) {
         return std::make_unique<AdamW>(p, cuda ? AdamWOptions(1e-2).amsgrad(true).fused(true)
                                                : AdamWOptions(1e-2).amsgrad(true).aten_fused(true));
       }},
      {"Sgd nesterov", [](const auto& p, bool cuda) {
         const auto o = SgdOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3);
         return std::make_unique<Sgd>(p, cuda ? SgdOptions(o).fused(true) : SgdOptions(o).aten_fused(true));
       }},
  };
  for (const auto& [name, make] : makers) {
    DYNAMIC_SECTION(name) {
      auto a = random_params(shapes, at::kDouble, 9);
      std::vector<at::Tensor> b;
      for (const auto& p : a) {
        b.push_back(p.detach().to(torch::kCUDA).requires_grad_());
      }
      auto on_cpu = make(a, false);
      auto on_cuda = make(b, true);
      int64_t ops = 0;
      for (int step = 0; step < 5; ++step) {
        set_grads(a, step);
        set_grads(b, step);
        on_cpu->step();
        ops += count_ops("aten::_fused_", [&] { on_cuda->step(); });
      }
      CHECK(ops == 5);
      std::vector<at::Tensor> back;
      for (const auto& p : b) {
        back.push_back(p.detach().cpu());
      }
      CHECK(max_rel_diff(back, a) <= 1e-13);
    }
  }
}
