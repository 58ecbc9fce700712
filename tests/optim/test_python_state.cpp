// trainkit::optim::load_torch_state: Python's torch.optim state_dict files (tests/golden/optim_state/, written by
// scripts/golden_optim_state.py) loaded into trainkit's optimizers, which then continue Python's trajectory.

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "optim/golden_problem.h"
#include "support.h"
#include "trainkit/io/torch_save.h"
#include "trainkit/optim.h"

using namespace trainkit::optim;
using trainkit::test::WhatContains;

namespace {

using OptimizerPtr = std::unique_ptr<torch::optim::Optimizer>;

std::string state_file(const std::string& name) {
  return trainkit::test::source_path("tests/golden/optim_state/" + name + ".pt");
}

/// The golden problem's parameters (shapes of optim.toml) holding `values`, requiring grad.
std::vector<at::Tensor> golden_params(const toml::node& values) {
  const auto& shapes = trainkit::test::golden("optim.toml");
  std::vector<at::Tensor> out;
  size_t k = 0;
  for (const auto& shape : *shapes["shapes"].as_array()) {
    const auto sizes = trainkit::test::values_of<int64_t>(shape);
    const auto v = trainkit::test::values_of<double>(*values.as_array()->get(k++));
    out.push_back(torch::tensor(v, torch::kFloat64).view(sizes).requires_grad_());
  }
  return out;
}

/// Optimizer `name` with its default options over the two param groups of the golden problem.
OptimizerPtr make_default(const std::string& name, const std::vector<at::Tensor>& p,
                          const std::vector<std::vector<size_t>>& groups = {{0, 1}, {2, 3}}) {
  trainkit::ArgTable table;
  trainkit::ArgReader reader(table, "test");
  const OptimizerSpec spec = parse_optimizer(name, reader);
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  for (const auto& g : groups) {
    std::vector<at::Tensor> members;
    for (const size_t i : g) {
      members.push_back(p[i]);
    }
    param_groups.emplace_back(members, spec.options->clone());
  }
  return make_optimizer(spec, param_groups);
}

}  // namespace

TEST_CASE("torch.optim state saved in Python continues its trajectory in trainkit (float64, two param groups)",
          "[optim][torch_state]") {
  const auto& g = trainkit::test::golden("optim_state.toml");
  const int64_t steps_before = g["steps_before"].value<int64_t>().value();
  size_t n_cases = 0;
  for (const auto& node : *g["case"].as_array()) {
    const auto& c = *node.as_table();
    const std::string name = c["name"].value<std::string>().value();
    const auto& records = *c["record"].as_array();
    DYNAMIC_SECTION(name) {
      REQUIRE(records.get(0)->as_table()->get("step")->value<int64_t>().value() == steps_before);
      auto params = golden_params(*records.get(0)->as_table()->get("params"));
      auto opt = make_default(c["optimizer"].value<std::string>().value(), params);
      load_torch_state(*opt, state_file(name));
      for (size_t r = 1; r < records.size(); ++r) {
        const auto& record = *records.get(r)->as_table();
        opt->zero_grad();
        trainkit::test::golden_loss(params).backward();
        opt->step();
        const auto want = golden_params(*record.get("params"));
        for (size_t k = 0; k < params.size(); ++k) {
          INFO(name << " step " << record["step"].value<int64_t>().value() << " param " << k);
          CHECK(torch::allclose(params[k].detach(), want[k], 1e-12, 1e-12));
        }
      }
    }
    ++n_cases;
  }
  CHECK(n_cases == 10);
}

TEST_CASE("load_torch_state loads each group's options from the file", "[optim][torch_state]") {
  auto params = golden_params(*trainkit::test::golden("optim.toml")["initial"].node());
  auto opt = make_default("adam", params);
  load_torch_state(*opt, state_file("adam_amsgrad"));
  const auto& g0 = static_cast<const AdamOptions&>(opt->param_groups()[0].options());
  const auto& g1 = static_cast<const AdamOptions&>(opt->param_groups()[1].options());
  CHECK(g0.lr() == 1e-2);
  CHECK(g0.amsgrad());
  CHECK(g0.weight_decay() == 0.1);
  CHECK(g1.lr() == 5e-3);
  CHECK(std::get<0>(g1.betas()) == 0.85);
  CHECK(static_cast<const AdamParamState&>(*opt->state().at(params[3].unsafeGetTensorImpl())).step() == 5);
}

TEST_CASE("load_torch_state refuses a file that does not fit the optimizer, naming group, parameter and key",
          "[optim][torch_state][errors]") {
  auto params = golden_params(*trainkit::test::golden("optim.toml")["initial"].node());
  SECTION("another optimizer's file") {
    auto adam = make_default("adam", params);
    CHECK_THROWS_WITH(load_torch_state(*adam, state_file("sgd")),
                      Catch::Contains("param group 0: unknown key 'momentum' (Adam takes lr, betas"));
    CHECK_THROWS_WITH(load_torch_state(*adam, state_file("adamax")),
                      Catch::Contains("param group 0, parameter 0 (id 0): unknown state key 'exp_inf' (Adam keeps step, "
                                      "exp_avg, exp_avg_sq, max_exp_avg_sq)"));
    auto adamw = make_default("adamw", params);
    CHECK_THROWS_WITH(load_torch_state(*adamw, state_file("adam_amsgrad")),
                      Catch::Contains("param group 0: 'decoupled_weight_decay': AdamW needs True, got False"));
  }
  SECTION("another number of param groups or of parameters") {
    auto one_group = make_default("adam", params, {{0, 1, 2, 3}});
    CHECK_THROWS_WITH(load_torch_state(*one_group, state_file("adam_amsgrad")),
                      Catch::Contains("2 param groups in the file, the optimizer has 1"));
    auto short_group = make_default("adam", params, {{0}, {2, 3}});
    CHECK_THROWS_WITH(load_torch_state(*short_group, state_file("adam_amsgrad")),
                      Catch::Contains("param group 0: 2 parameters in the file, the optimizer's group has 1"));
  }
  SECTION("a state tensor of another shape or dtype") {
    std::vector<at::Tensor> swapped = params;
    swapped[2] = torch::zeros({5, 2}, torch::kFloat64);
    auto opt = make_default("nadam", swapped);
    CHECK_THROWS_WITH(load_torch_state(*opt, state_file("nadam")),
                      Catch::Contains("param group 1, parameter 0 (id 2): 'exp_avg': shape [2, 5] but the parameter's "
                                      "is [5, 2]"));
    std::vector<at::Tensor> floats;
    for (const auto& p : params) {
      floats.push_back(p.detach().to(torch::kFloat32).requires_grad_());
    }
    auto single = make_default("rprop", floats);
    CHECK_THROWS_WITH(load_torch_state(*single, state_file("rprop")),
                      Catch::Contains("param group 0, parameter 0 (id 0): 'prev': dtype Double but the parameter's is "
                                      "Float"));
  }
  SECTION("a missing state key, a refused option, and nothing half-loaded") {
    const std::string source = state_file("adam_amsgrad");
    c10::IValue sd = trainkit::io::load_pt_object(source);
    auto state = sd.toGenericDict().at(c10::IValue("state")).toGenericDict();
    REQUIRE(state.at(c10::IValue(int64_t{3})).toGenericDict().erase(c10::IValue("max_exp_avg_sq")));
    auto opt = make_default("adam", params);
    CHECK_THROWS_WITH(load_torch_state(*opt, sd, source),
                      Catch::Contains("param group 1, parameter 1 (id 3): missing state key 'max_exp_avg_sq'"));
    // The groups' options were read before the failing state: the optimizer still has its own.
    CHECK(opt->param_groups()[0].options().get_lr() == AdamOptions().lr());
    CHECK(opt->state().empty());

    c10::IValue bad_lr = trainkit::io::load_pt_object(source);
    bad_lr.toGenericDict().at(c10::IValue("param_groups")).toListRef()[1].toGenericDict().insert_or_assign(
        c10::IValue("lr"), c10::IValue(-1.0));
    CHECK_THROWS_WITH(load_torch_state(*opt, bad_lr, source),
                      Catch::Contains("param group 1: 'lr': expected a number >= 0, got -1"));
    CHECK(opt->state().empty());
  }
  SECTION("an unreadable file and an optimizer it does not know") {
    const auto path = std::filesystem::temp_directory_path() / "trainkit_not_a_state.pt";
    std::ofstream(path) << "not a zip";
    auto opt = make_default("adam", params);
    CHECK_THROWS_WITH(load_torch_state(*opt, path.string()),
                      Catch::Contains(path.string() + ": not a readable torch.save file"));
    std::filesystem::remove(path);
    torch::optim::Adam libtorch({params[0]});
    CHECK_THROWS_WITH(load_torch_state(libtorch, state_file("adam_amsgrad")),
                      Catch::Contains("load_torch_state takes Adam, AdamW"));
  }
}
