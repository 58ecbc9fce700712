// PyTorch torch.save files: a state_dict pickled by Python read bitwise and in its order, the golden CNN
// giving Python's logits in C++ from either format, C++ round trips of every dtype, and errors.
#include <torch/serialize.h>
#include <torch/torch.h>

#include "io/io_support.h"
#include "support.h"
#include "trainkit/io/safetensors.h"
#include "trainkit/io/torch_save.h"
#include "trainkit/nn/models.h"

using namespace trainkit::io;
using trainkit::test::TempDir;
using trainkit::test::WhatContains;

namespace {

std::vector<int64_t> ints_of(const toml::node_view<const toml::node>& node) {
  std::vector<int64_t> out;
  for (const auto& v : *node.as_array()) {
    out.push_back(v.value<int64_t>().value());
  }
  return out;
}

std::vector<float> floats_of(const toml::node_view<const toml::node>& node) {
  std::vector<float> out;
  for (const auto& v : *node.as_array()) {
    out.push_back(static_cast<float>(v.value<double>().value()));
  }
  return out;
}

torch::nn::Sequential golden_cnn(const toml::table& golden) {
  const auto cnn = golden["cnn"];
  return trainkit::nn::make_cnn(trainkit::nn::CnnOptions()
                                    .in_channels(cnn["in_channels"].value<int64_t>().value())
                                    .image_size(cnn["image_size"].value<int64_t>().value())
                                    .channels(ints_of(cnn["channels"]))
                                    .hidden(cnn["hidden"].value<int64_t>().value())
                                    .dropout(cnn["dropout"].value<double>().value())
                                    .batch_norm(cnn["batch_norm"].value<bool>().value())
                                    .num_classes(cnn["num_classes"].value<int64_t>().value()));
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("a state_dict saved by Python's torch.save reads bitwise, in its order", "[io][torch_save][golden]") {
  const auto& golden = trainkit::test::golden("interop.toml");
  const auto rows = trainkit::test::golden_tensors(golden, "cnn_tensor");
  for (const char* file : {"cnn.pt", "cnn.safetensors"}) {
    INFO(file);
    const std::string path = trainkit::test::source_path(std::string("tests/golden/interop/") + file);
    const TensorDict tensors = std::string(file) == "cnn.pt" ? load_pt(path) : load_safetensors(path).tensors;
    trainkit::test::check_golden_tensors(tensors, rows);
    std::vector<std::string> names;
    for (const auto& row : rows) {
      names.push_back(row.name);
    }
    if (std::string(file) == "cnn.pt") {
      CHECK(tensors.keys() == names);  // the pickled OrderedDict's order
    }
  }
}

TEST_CASE("a plain dict of every dtype saved by Python's torch.save reads bitwise", "[io][torch_save][golden]") {
  const auto& golden = trainkit::test::golden("interop.toml");
  trainkit::test::check_golden_tensors(load_pt(trainkit::test::source_path("tests/golden/interop/dtypes.pt")),
                                       trainkit::test::golden_tensors(golden, "tensor"));
}

TEST_CASE("the golden CNN gives Python's logits in C++, loaded from either format", "[io][torch_save][golden]") {
  const auto& golden = trainkit::test::golden("interop.toml");
  const auto cnn = golden["cnn"];
  const at::Tensor input = torch::tensor(floats_of(cnn["input"])).reshape(ints_of(cnn["input_shape"]));
  const at::Tensor expected = torch::tensor(floats_of(cnn["logits"])).reshape({input.size(0), -1});
  for (const char* file : {"cnn.pt", "cnn.safetensors"}) {
    INFO(file);
    const std::string path = trainkit::test::source_path(std::string("tests/golden/interop/") + file);
    torch::manual_seed(0);
    auto net = golden_cnn(golden);
    const LoadReport report = std::string(file) == "cnn.pt" ? load_pt(*net, path) : load_safetensors(*net, path);
    CHECK(report.ok());
    net->eval();
    torch::NoGradGuard no_grad;
    const at::Tensor logits = net->forward(input);
    CHECK((logits - expected).abs().max().item<double>() <= 1e-6);
  }
}

TEST_CASE("torch.save files round trip in C++: every dtype bitwise, views compact", "[io][torch_save]") {
  TempDir tmp("pt-round-trip");
  TensorDict tensors;
  for (const auto& [name, t] : trainkit::test::every_dtype(4)) {
    tensors.insert(name, t);
  }
  const at::Tensor base = torch::arange(100, torch::kFloat32);
  tensors.insert("view", base.slice(0, 10, 13));
  const at::Tensor with_grad = torch::ones({2}, torch::requires_grad());
  tensors.insert("param", with_grad);
  const std::string path = tmp.str("all.pt");
  save_pt(path, tensors);
  const TensorDict got = load_pt(path);
  CHECK(got.keys() == tensors.keys());
  for (const auto& item : tensors) {
    INFO(item.key());
    CHECK(got[item.key()].scalar_type() == item.value().scalar_type());
    CHECK(got[item.key()].sizes() == item.value().sizes());
    CHECK(trainkit::test::hex_of(got[item.key()]) == trainkit::test::hex_of(item.value()));
  }
  CHECK(got["view"].storage().nbytes() == 12);  // the view alone, not its 400-byte base
  CHECK_FALSE(got["param"].requires_grad());
}

TEST_CASE("load_pt refuses what is not a dict of tensors, naming the file and the key", "[io][torch_save][errors]") {
  TempDir tmp("pt-errors");
  const std::string path = tmp.str("bad.pt");
  SECTION("missing file") {
    CHECK_THROWS_MATCHES(load_pt(tmp.str("none.pt")), IoError, WhatContains("none.pt: cannot open"));
  }
  SECTION("not an archive") {
    std::ofstream(path) << "not a zip archive at all";
    CHECK_THROWS_MATCHES(load_pt(path), IoError, WhatContains(path + ": not a readable torch.save file"));
  }
  SECTION("truncated archive") {
    save_pt(path, TensorDict{{"w", torch::ones({64})}});
    const std::string bytes = trainkit::test::read_text(path);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
    CHECK_THROWS_MATCHES(load_pt(path), IoError, WhatContains(path + ": not a readable torch.save file"));
  }
  SECTION("a list, not a dict") {
    write_bytes(path, torch::pickle_save(c10::IValue(std::vector<int64_t>{1, 2})));
    CHECK_THROWS_MATCHES(load_pt(path), IoError, WhatContains("not a dict of tensors"));
  }
  SECTION("a value that is not a tensor") {
    c10::Dict<std::string, int64_t> dict;
    dict.insert("epoch", 3);
    write_bytes(path, torch::pickle_save(c10::IValue(dict)));
    CHECK_THROWS_MATCHES(load_pt(path), IoError, WhatContains(path + ": the value of 'epoch' is a Int"));
  }
  SECTION("an undefined tensor is not written") {
    CHECK_THROWS_MATCHES(save_pt(path, TensorDict{{"u", at::Tensor()}}), std::invalid_argument,
                         WhatContains("'u' is undefined"));
  }
}
