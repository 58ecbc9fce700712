// model_parallel: a Fashion-MNIST MLP split into two stages on two devices (--device: two CPU stages by
// default; cuda: cuda:0 and cuda:1, or both on cuda:0 with one GPU; cuda:<i>: both on cuda:i), trained with
// GPipe-style micro-batch pipelining (trainkit::dist::Pipeline). An
// unsplit copy of the model trains on the same batches alongside; the program reports the largest
// parameter difference between the two at the end (it must be at rounding level) and both speeds.
#include <chrono>
#include <cstdio>
#include <regex>

#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/main.h"
#include "trainkit/app/run.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/dist/pipeline.h"

namespace {

torch::nn::Sequential make_net(int64_t hidden) {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, hidden), torch::nn::ReLU(),
                               torch::nn::Linear(hidden, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
                               torch::nn::ReLU(), torch::nn::Linear(hidden, 10));
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"Model parallelism: an MLP split over two devices with GPipe micro-batch pipelining"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t steps = 50;
  int64_t batch_size = 256;
  int64_t chunks = 4;
  int64_t hidden = 1024;
  std::string device_name = "cpu";
  cli.option("--data-dir", data_dir, "Directory with the gzip'd IDX files").show_default();
  cli.option("--steps", steps, "Optimizer steps").show_default().positive();
  cli.option("--batch-size", batch_size, "Batch size").show_default().positive();
  cli.option("--chunks", chunks, "Micro-batches per batch").show_default().positive();
  cli.option("--hidden", hidden, "Width of the hidden layers").show_default().positive();
  cli.option("--device", device_name,
             "cpu (two CPU stages), cuda (stages on cuda:0 and cuda:1; both on cuda:0 with one GPU) or cuda:<index> "
             "(both stages there)")
      .show_default();
  if (auto rc = cli.parse(argc, argv)) return *rc;
  if (!std::regex_match(device_name, std::regex("cpu|cuda(:[0-9]+)?"))) {
    std::fprintf(stderr, "model_parallel: --device '%s' is not cpu, cuda or cuda:<index>\n", device_name.c_str());
    return 2;
  }
  const int64_t gpus = device_name == "cpu" ? 0 : static_cast<int64_t>(torch::cuda::device_count());
  if (device_name != "cpu" && gpus == 0) {
    std::fprintf(stderr, "model_parallel: --device %s: no CUDA device is available\n", device_name.c_str());
    return 2;
  }
  trainkit::app::set_log_level("info");

  return trainkit::app::run_main([&] {
    const torch::Device first_device = trainkit::app::choose_device(device_name, 1, 0, gpus, "--device");
    const std::vector<c10::Device> devices{
        first_device, device_name == "cuda" && gpus >= 2 ? c10::Device("cuda:1") : first_device};
    const auto train = trainkit::data::load_mnist_split(data_dir, true, steps * batch_size);
    trainkit::data::TensorLoader loader(train.images, train.labels,
                                        trainkit::data::TensorLoaderOptions().batch_size(batch_size));

    auto whole = make_net(hidden);
    whole->to(devices.front());
    auto split_src = make_net(hidden);  // the same initial weights, split after the second ReLU
    torch::nn::Sequential first, second;
    size_t index = 0;
    for (const auto& module : *split_src) (index++ < 5 ? first : second)->push_back(module);
    trainkit::dist::Pipeline pipe({first, second}, devices, trainkit::dist::PipelineOptions().chunks(chunks));
    torch::optim::SGD opt_whole(whole->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::SGD opt_pipe(pipe.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    std::printf("model_parallel: stages on %s and %s, %lld micro-batches of %lld\n", devices[0].str().c_str(),
                devices[1].str().c_str(), static_cast<long long>(chunks),
                static_cast<long long>((batch_size + chunks - 1) / chunks));

    double t_whole = 0, t_pipe = 0, loss_pipe = 0;
    for (int64_t step = 0; step < steps; ++step) {
      const auto batch = loader.batch(step % loader.num_batches());
      auto t0 = std::chrono::steady_clock::now();
      opt_whole.zero_grad();
      torch::nn::functional::cross_entropy(whole->forward(batch.input().to(devices.front())),
                                           batch.target().to(devices.front()))
          .backward();
      opt_whole.step();
      auto t1 = std::chrono::steady_clock::now();
      opt_pipe.zero_grad();
      const at::Tensor loss =
          torch::nn::functional::cross_entropy(pipe.forward(batch.input()), batch.target().to(pipe.output_device()));
      loss.backward();
      opt_pipe.step();
      auto t2 = std::chrono::steady_clock::now();
      t_whole += std::chrono::duration<double>(t1 - t0).count();
      t_pipe += std::chrono::duration<double>(t2 - t1).count();
      loss_pipe = loss.item<double>();
    }
    double max_diff = 0;
    const auto a = whole->parameters();
    const auto b = pipe.parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      max_diff = std::max(max_diff, (a[i].cpu() - b[i].cpu()).abs().max().item<double>());
    }
    const double samples = static_cast<double>(steps * batch_size);
    std::printf("after %lld steps: loss %.4f; max |param(pipeline) - param(unsplit)| = %.3g\n",
                static_cast<long long>(steps), loss_pipe, max_diff);
    std::printf("unsplit: %.0f samples/s; pipeline: %.0f samples/s\n", samples / t_whole, samples / t_pipe);
    if (max_diff > 1e-3) {
      std::fprintf(stderr, "model_parallel: the pipeline diverged from the unsplit model\n");
      return 1;
    }
    return 0;
  });
}
