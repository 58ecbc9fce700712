// What trainkit writes, read by Python's own readers (scripts/interop_check.py): safetensors.torch and
// torch.load(weights_only=True) get every dtype bitwise, and the built-in CNN and ResNet-20 load into
// their Python twins and give the C++ logits to 1e-6.
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "io/io_support.h"
#include "support.h"
#include "trainkit/io/safetensors.h"
#include "trainkit/io/torch_save.h"
#include "trainkit/nn/models.h"
#include "trainkit/nn/resnet.h"

using namespace trainkit::io;

namespace {

// Writes a model's state_dict in both formats and its eval-mode logits, after a few training-mode
// forwards so that the BatchNorm statistics are not their initial values.
nlohmann::json write_model(const trainkit::test::TempDir& tmp, const std::string& name, const std::string& kind,
                           torch::nn::Sequential net, const nlohmann::json& options, const at::Tensor& input) {
  {
    torch::NoGradGuard no_grad;
    net->train();
    for (int i = 0; i < 3; ++i) {
      net->forward(torch::randn_like(input) * 2 + 0.5);
    }
    net->eval();
    const at::Tensor logits = net->forward(input);
    save_safetensors(tmp.str(name + "_io.safetensors"), TensorDict{{"input", input}, {"logits", logits}});
  }
  save_safetensors(tmp.str(name + ".safetensors"), *net);
  save_pt(tmp.str(name + ".pt"), *net);
  return {{"name", name},
          {"kind", kind},
          {"options", options},
          {"safetensors", name + ".safetensors"},
          {"pt", name + ".pt"},
          {"io", name + "_io.safetensors"}};
}

}  // namespace

// Run by the ctest `interop_read_by_python`, which sets TRAINKIT_PYTHON to the project's venv.
TEST_CASE("Python's safetensors and torch.load read what trainkit writes", "[.interop-python]") {
  const char* python = std::getenv("TRAINKIT_PYTHON");
  if (python == nullptr || *python == '\0' || !std::filesystem::exists(python)) {
    const std::string got = python ? python : "nothing";
    TRAINKIT_SKIP("TRAINKIT_PYTHON names no Python (got " << got << "); run ctest -R interop_read_by_python");
  }
  trainkit::test::TempDir tmp("interop-python");
  TensorDict tensors;
  nlohmann::json expected = nlohmann::json::object();
  for (const auto& [name, t] : trainkit::test::every_dtype(7)) {
    tensors.insert(name, t);
    expected[name] = {{"dtype", trainkit::test::safetensors_dtype(t.scalar_type())},
                      {"shape", t.sizes().vec()},
                      {"hex", trainkit::test::hex_of(t)}};
  }
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"written_by", "trainkit"}};
  save_safetensors(tmp.str("dtypes.safetensors"), tensors, metadata);
  save_pt(tmp.str("dtypes.pt"), tensors);

  torch::manual_seed(11);
  nlohmann::json models = nlohmann::json::array();
  models.push_back(write_model(tmp, "cnn", "cnn", trainkit::nn::make_cnn(),
                               {{"in_channels", 1}, {"image_size", 28}, {"channels", {32, 64}}, {"hidden", 128},
                                {"dropout", 0.25}, {"batch_norm", true}, {"num_classes", 10}},
                               torch::randn({4, 1, 28, 28})));
  models.push_back(write_model(tmp, "resnet20", "cifar_resnet",
                               trainkit::nn::make_cifar_resnet(trainkit::nn::ResNetOptions().depth(20)),
                               {{"depth", 20}, {"in_channels", 3}, {"num_classes", 10}},
                               torch::randn({4, 3, 32, 32})));
  const nlohmann::json manifest = {
      {"tensors", {{"safetensors", "dtypes.safetensors"}, {"pt", "dtypes.pt"}, {"metadata", metadata},
                   {"expected", expected}}},
      {"models", models}};
  std::ofstream(tmp.str("manifest.json")) << manifest.dump(1);

  const std::string log = tmp.str("check.log");
  const auto quoted = [](const std::string& text) { return "\"" + text + "\""; };
  const std::string command = quoted(python) + " " + quoted(trainkit::test::source_path("scripts/interop_check.py")) +
                              " " + quoted(tmp.str()) + " > " + quoted(log) + " 2>&1";
  const int code = std::system(command.c_str());
  INFO(command << "\n" << trainkit::test::read_text(log));
  CHECK(code == 0);
}
