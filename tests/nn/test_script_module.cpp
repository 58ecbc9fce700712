// nn::ScriptModule and `trainkit train` with model.name = "torchscript": a model scripted and saved in Python
// (scripts/golden_torchscript.py) gives Python's outputs in C++, and trained by the train job it ends with
// the parameters and the test loss of the same training in Python (same data order, SGD), to 1e-6 and 1e-5;
// the trained model written back loads with torch::jit::load; checkpoint.export = "torchscript" writes whole
// models of the final, EMA and best weights.
#include <filesystem>
#include <fstream>

#include <torch/script.h>
#include <torch/torch.h>

#include "support.h"
#include "trainkit/app/jobs.h"
#include "trainkit/io/safetensors.h"
#include "trainkit/nn/script_module.h"

using namespace trainkit;
using trainkit::test::WhatContains;

namespace {

std::string golden_file(const std::string& rel) { return trainkit::test::source_path("tests/golden/" + rel); }

/// Every parameter of a script module by name.
std::map<std::string, at::Tensor> parameters_of(const torch::jit::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) {
    out[p.name] = p.value;
  }
  return out;
}

}  // namespace

TEST_CASE("ScriptModule: a model scripted in Python, its parameters, modes and outputs", "[nn][torchscript]") {
  const auto& golden = trainkit::test::golden("torchscript.toml");
  nn::ScriptModule model(nn::ScriptModuleImpl::load(golden_file(*golden["model"]["file"].value<std::string>())));
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) {
    names.push_back(p.key());
  }
  CHECK(names == trainkit::test::values_of<std::string>(*golden["model"]["parameters"].node()));
  // Shared tensors: a change through the nn::Module side is the script module's.
  CHECK(model->named_parameters()["out.bias"].is_same(parameters_of(model->script()).at("out.bias")));
  model->eval();
  CHECK_FALSE(model->script().is_training());
  CHECK_FALSE(model->children().front()->is_training());
  model->train();
  CHECK(model->script().is_training());

  model->eval();
  const auto shape = trainkit::test::values_of<int64_t>(*golden["model"]["input_shape"].node());
  const at::Tensor x = torch::linspace(-2, 2, 2 * 784).reshape(shape);
  const at::Tensor logits = model->forward({x});
  const at::Tensor expected =
      torch::tensor(trainkit::test::values_of<double>(*golden["model"]["logits"].node()), torch::kFloat32).reshape({2, 10});
  CHECK(torch::allclose(logits, expected, 0.0, 1e-6));

  CHECK_THROWS_MATCHES(nn::ScriptModuleImpl::load(golden_file("torchscript.toml")), std::runtime_error,
                       WhatContains("torchscript.toml: not a TorchScript file"));
}

TEST_CASE("trainkit train trains a TorchScript model as Python trains it", "[nn][torchscript][app]") {
  const auto& golden = trainkit::test::golden("torchscript.toml");
  trainkit::test::TempDir tmp("torchscript");
  std::ofstream(tmp.str("ts.toml")) << *golden["train"]["config"].value<std::string>();
  app::TrainJobOptions job;
  job.config_path = tmp.str("ts.toml");
  job.overrides = {"model.torchscript=" + golden_file(*golden["model"]["file"].value<std::string>())};
  job.out_dir = tmp.str("run");
  const app::TrainJobResult result = app::run_train_job(job);
  REQUIRE(result.steps == 20);  // 2 epochs of 500 / 50
  CHECK(result.test_loss == Approx(*golden["train"]["test_loss"].value<double>()).margin(1e-5));

  // The trained model, written back, loads as a TorchScript module with Python's trained parameters.
  const auto trained = parameters_of(torch::jit::load(tmp.str("run/model.torchscript.pt")));
  const auto python = parameters_of(torch::jit::load(golden_file(*golden["train"]["trained"].value<std::string>())));
  REQUIRE(trained.size() == 4);
  for (const auto& [name, tensor] : python) {
    INFO(name);
    CHECK((trained.at(name) - tensor).abs().max().item<double>() <= 1e-6);
  }
  // Training moved the weights (the optimizer updates reach the script module).
  const auto initial = parameters_of(torch::jit::load(golden_file(*golden["model"]["file"].value<std::string>())));
  CHECK((trained.at("out.weight") - initial.at("out.weight")).abs().max().item<double>() > 1e-3);

  SECTION("without model.torchscript the config names the key") {
    job.overrides = {};
    job.out_dir = tmp.str("run2");
    CHECK_THROWS_MATCHES(app::run_train_job(job), app::ConfigError,
                         WhatContains("model.name = \"torchscript\" needs model.torchscript"));
  }
}

TEST_CASE("checkpoint.export = torchscript: whole TorchScript models of the final, EMA and best weights",
          "[nn][torchscript][app]") {
  const auto& golden = trainkit::test::golden("torchscript.toml");
  trainkit::test::TempDir tmp("torchscript-export");
  std::ofstream(tmp.str("ts.toml")) << *golden["train"]["config"].value<std::string>();
  app::TrainJobOptions job;
  job.config_path = tmp.str("ts.toml");
  job.overrides = {"model.torchscript=" + golden_file(*golden["model"]["file"].value<std::string>()),
                   "checkpoint.export=[\"safetensors\", \"torchscript\"]", "ema.enabled=true",
                   "checkpoint.save_top_k=1"};
  job.out_dir = tmp.str("run");
  app::run_train_job(job);
  // Each .torchscript.pt is a whole model (torch::jit::load) holding exactly the weights of its .safetensors.
  const auto same_weights = [&](const std::string& stem) {
    INFO(stem);
    const auto script = parameters_of(torch::jit::load(tmp.str(stem + ".torchscript.pt")));
    const io::SafetensorsFile copy = io::load_safetensors(tmp.str(stem + ".safetensors"));
    REQUIRE(script.size() == 4);
    for (const auto& [name, tensor] : script) {
      INFO(name);
      CHECK(torch::equal(tensor, copy.tensors[name]));
    }
    return script;
  };
  const auto model = same_weights("run/model");
  const auto ema = same_weights("run/ema");
  CHECK(!torch::equal(model.at("out.weight"), ema.at("out.weight")));  // the EMA's weights, not the raw ones
  int best = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.str("run/best"))) {
    const std::string name = entry.path().filename().string();
    const std::string suffix = ".torchscript.pt";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      same_weights("run/best/" + name.substr(0, name.size() - suffix.size()));
      ++best;
    }
  }
  CHECK(best == 1);  // save_top_k = 1: a replaced best file's copies go with it


  // A model that is not TorchScript cannot be exported as one: the config says so before training.
  app::TrainJobOptions cnn;
  cnn.config_path = tmp.str("ts.toml");
  cnn.overrides = {"model.name=\"cnn\"", "checkpoint.export=[\"torchscript\"]"};
  cnn.out_dir = tmp.str("run_cnn");
  CHECK_THROWS_MATCHES(app::run_train_job(cnn), app::ConfigError,
                       WhatContains("checkpoint.export = [..., \"torchscript\"] writes whole TorchScript models, "
                                    "which needs model.name = \"torchscript\" (this run's model is \"cnn\")"));
}
