// GPipe-style pipeline: two CPU stages with micro-batches give the unsplit model's outputs, gradients and
// trained parameters (float64).
#include <sys/wait.h>

#include <cstdlib>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/dist/pipeline.h"

using Catch::Matchers::Contains;

namespace {

torch::nn::Sequential make_net() {
  torch::manual_seed(11);
  torch::nn::Sequential net(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16), torch::nn::ReLU(),
                            torch::nn::Linear(16, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
  net->to(torch::kFloat64);
  return net;
}

/// The same layers as make_net(), split after the fourth module.
std::vector<torch::nn::Sequential> make_stages() {
  auto net = make_net();
  torch::nn::Sequential first, second;
  size_t index = 0;
  for (const auto& module : *net) (index++ < 4 ? first : second)->push_back(module);
  return {first, second};
}

}  // namespace

TEST_CASE("Pipeline of two CPU stages equals the unsplit model", "[dist][pipeline]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor x = torch::randn({30, 6}, gen, torch::TensorOptions().dtype(torch::kFloat64));
  const at::Tensor y = torch::randint(0, 3, {30}, gen, torch::TensorOptions().dtype(torch::kInt64));
  for (int64_t chunks : {1, 4, 7}) {
    DYNAMIC_SECTION("chunks " << chunks) {
      auto net = make_net();
      trainkit::dist::Pipeline pipe(make_stages(), {torch::kCPU, torch::kCPU},
                                    trainkit::dist::PipelineOptions().chunks(chunks));
      torch::optim::SGD opt_net(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      torch::optim::SGD opt_pipe(pipe.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      for (int step = 0; step < 3; ++step) {
        opt_net.zero_grad();
        opt_pipe.zero_grad();
        const at::Tensor out_net = net->forward(x);
        const at::Tensor out_pipe = pipe.forward(x);
        CHECK((out_net - out_pipe).abs().max().item<double>() <= 1e-12);
        torch::nn::functional::cross_entropy(out_net, y).backward();
        torch::nn::functional::cross_entropy(out_pipe, y).backward();
        const auto a = net->parameters();
        const auto b = pipe.parameters();
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); ++i) {
          CHECK((a[i].grad() - b[i].grad()).abs().max().item<double>() <= 1e-12);
        }
        opt_net.step();
        opt_pipe.step();
      }
      const auto a = net->parameters();
      const auto b = pipe.parameters();
      for (size_t i = 0; i < a.size(); ++i) CHECK((a[i] - b[i]).abs().max().item<double>() <= 1e-12);
      // Trained: far from the start.
      CHECK((make_net()->parameters()[0] - b[0]).abs().max().item<double>() > 1e-3);
    }
  }
}

TEST_CASE("Pipeline: bad input and errors inside a stage", "[dist][pipeline]") {
  CHECK_THROWS_WITH(trainkit::dist::Pipeline(make_stages(), {torch::kCPU}), Contains("2 stages but 1 devices"));
  CHECK_THROWS_WITH(trainkit::dist::Pipeline(make_stages(), {torch::kCPU, torch::kCPU},
                                             trainkit::dist::PipelineOptions().chunks(0)),
                    Contains("invalid chunks: 0"));
  trainkit::dist::Pipeline pipe(make_stages(), {torch::kCPU, torch::kCPU});
  // Wrong width: the first stage throws, the error reaches the caller instead of hanging the other stage.
  CHECK_THROWS(pipe.forward(torch::zeros({8, 5}, torch::kFloat64)));
}

TEST_CASE("Pipeline: each stage's thread runs with its stage's device current", "[dist][pipeline]") {
  // dist_worker's test device "testdev" has two devices and a current device per thread, starting at 0 as
  // CUDA's: a stage thread without a device guard would run stage 1 with testdev:0 current.
  trainkit::test::TempDir tmp("pipeline-guard");
  const std::string log = tmp.str("out.txt");
  const int status = std::system(("env -u RANK -u WORLD_SIZE timeout -s KILL 120 " + std::string(TRAINKIT_DIST_WORKER_PATH) +
                                  " --mode pipeline > " + log + " 2>&1").c_str());
  const std::string output = trainkit::test::read_text(log);
  INFO(output);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK_THAT(output, Contains("stage 0: current device testdev:0\n"));
  CHECK_THAT(output, Contains("stage 1: current device testdev:1\n"));
  const std::string key = "pipeline output on testdev:1, max difference from the unsplit model ";
  const auto at = output.find(key);
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(output.substr(at + key.size())) <= 1e-12);
}
