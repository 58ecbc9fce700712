// zero: gradient and optimizer-state memory per rank with ZeRO stages 1 and 2. Trains an MLP on Fashion-MNIST
// with DistributedDataParallel and a ZeroRedundancyOptimizer(Adam) under the launcher, once per stage, then
// prints for every rank the parameters it owns and the bytes of gradients and Adam state it holds, against
// the unsharded run, and checks that both stages trained the same model:
//   trainkit launch --nproc 2 -- build/apps/zero --steps 20
// --offload also trains stage 2 with each rank's Adam on the host (optim::OffloadOptimizer) and prints what
// stays on the device and what moved to the host.
// --device cuda trains rank r on cuda:<LOCAL_RANK>: ZeRO-2's reduces and broadcasts then go through NCCL,
// the loss mean and the barriers through Gloo.
#include <algorithm>
#include <cstdio>
#include <regex>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/run.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/dist/zero.h"
#include "trainkit/nn/models.h"
#include "trainkit/optim/offload.h"

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"ZeRO stages 1 and 2: gradient and Adam state memory per rank vs unsharded (run under `trainkit launch` or torchrun)"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t steps = 20;
  int64_t batch_size = 128;
  int64_t hidden = 1024;
  double lr = 1e-3;
  std::string device_name = "cpu";
  cli.option("--data-dir", data_dir, "Directory with the gzip'd IDX files").show_default();
  cli.option("--steps", steps, "Optimizer steps").show_default().positive();
  cli.option("--batch-size", batch_size, "Global batch size").show_default().positive();
  cli.option("--hidden", hidden, "Width of the MLP's two hidden layers").show_default().positive();
  cli.option("--lr", lr, "Adam learning rate").show_default().positive();
  cli.option("--device", device_name,
             "cpu, cuda (rank r of a launch on cuda:<LOCAL_RANK>, one process on cuda:0) or cuda:<index> (one "
             "process only)")
      .show_default();
  bool offload = false;
  cli.flag("--offload", offload, "Also train stage 2 with each rank's Adam offloaded to the host (optim::OffloadOptimizer)");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  if (!std::regex_match(device_name, std::regex("cpu|cuda(:[0-9]+)?"))) {
    std::fprintf(stderr, "zero: --device '%s' is not cpu, cuda or cuda:<index>\n", device_name.c_str());
    return 2;
  }
  const int64_t gpus = device_name == "cpu" ? 0 : static_cast<int64_t>(torch::cuda::device_count());
  if (device_name != "cpu" && gpus == 0) {
    std::fprintf(stderr, "zero: --device %s: no CUDA device is available\n", device_name.c_str());
    return 2;
  }

  int64_t rank = 0;
  try {
    torch::set_num_threads(1);
    const auto init = trainkit::dist::options_from_env();
    const torch::Device device = trainkit::app::choose_device(
        device_name, init.world_size(), init.local_rank(), gpus, "--device");
    if (device.is_cuda()) {
      // The current device of this process, before NCCL's communicators are made.
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
    }
    auto pg = trainkit::dist::ProcessGroup::init(init);
    rank = pg->rank();
    const int64_t world = pg->world_size();
    const auto train = trainkit::data::load_mnist_split(data_dir, true, steps * batch_size);
    trainkit::data::TensorLoader loader(
        train.images, train.labels,
        trainkit::data::TensorLoaderOptions().batch_size(std::max<int64_t>(1, batch_size / world)).num_replicas(world).rank(rank));
    // The unsharded reference: one Adam over all parameters of a copy, stepped once (its state is then
    // allocated in full), and all of its gradients.
    auto copy = trainkit::nn::make_mlp(trainkit::nn::MlpOptions().hidden({hidden, hidden}));
    for (auto& p : copy->parameters()) p.mutable_grad() = torch::zeros_like(p);
    torch::optim::Adam full(copy->parameters(), torch::optim::AdamOptions(lr));
    full.step();
    const double full_state = static_cast<double>(trainkit::dist::optimizer_state_bytes(full));
    double full_grads = 0;
    for (const auto& p : copy->parameters()) full_grads += static_cast<double>(p.grad().nbytes());
    std::vector<at::Tensor> finals[2];
    for (const int64_t stage : {int64_t{1}, int64_t{2}}) {
      torch::manual_seed(0);
      auto model = trainkit::nn::make_mlp(trainkit::nn::MlpOptions().hidden({hidden, hidden}));
      model->to(device);
      trainkit::dist::DistributedDataParallel ddp(model.ptr(), pg);
      trainkit::dist::ZeroRedundancyOptimizer zero(
          ddp,
          [lr](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
            return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
          },
          trainkit::dist::ZeroOptions().stage(stage));
      at::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
      double grads = 0;
      for (int64_t step = 0; step < steps; ++step) {
        const auto batch = loader.batch(step % loader.num_batches());
        zero.zero_grad();
        const auto loss = torch::nn::functional::cross_entropy(model->forward(batch.input().to(device)),
                                                               batch.target().to(device));
        loss.backward();
        grads = static_cast<double>(zero.local_gradient_bytes());  // after backward: stage 2 holds its shard only
        zero.step();
        loss_sum += loss.detach().to(torch::kFloat64);  // on the device: no read per step
      }
      const double mean_loss = pg->all_reduce_mean(loss_sum.item<double>() / static_cast<double>(steps));
      const double state = static_cast<double>(zero.local_state_bytes());
      for (int64_t r = 0; r < world; ++r) {
        pg->barrier();
        if (r == rank) {
          std::printf("stage %lld rank %lld: %zu of %zu parameter tensors; gradients %.2f MiB, Adam state %.2f MiB: "
                      "%.1f%% of the unsharded %.2f MiB\n",
                      static_cast<long long>(stage), static_cast<long long>(rank), zero.shard(rank).size(),
                      model->parameters().size(), grads / 1048576.0, state / 1048576.0,
                      100.0 * (grads + state) / (full_grads + full_state), (full_grads + full_state) / 1048576.0);
          std::fflush(stdout);
        }
      }
      if (pg->is_main()) {
        std::printf("stage %lld, %lld rank(s): mean training loss over %lld steps %.4f\n", static_cast<long long>(stage),
                    static_cast<long long>(world), static_cast<long long>(steps), mean_loss);
      }
      for (const auto& p : model->parameters()) finals[stage - 1].push_back(p.detach().clone());
    }
    if (offload) {
      // --offload: stage 2 again with each rank's Adam an optim::OffloadOptimizer. The device keeps its
      // parameters and its shard of the gradients; the state, the masters and the gradient buffers are on the host.
      torch::manual_seed(0);
      auto model = trainkit::nn::make_mlp(trainkit::nn::MlpOptions().hidden({hidden, hidden}));
      model->to(device);
      trainkit::dist::DistributedDataParallel ddp(model.ptr(), pg);
      trainkit::dist::ZeroRedundancyOptimizer zero(
          ddp, {torch::optim::OptimizerParamGroup(model->parameters())},
          trainkit::optim::offloaded([lr](std::vector<torch::optim::OptimizerParamGroup> host)
                                         -> std::unique_ptr<torch::optim::Optimizer> {
            return std::make_unique<torch::optim::Adam>(host.front().params(), torch::optim::AdamOptions(lr));
          }),
          trainkit::dist::ZeroOptions().stage(2));
      double grads = 0;
      for (int64_t step = 0; step < steps; ++step) {
        const auto batch = loader.batch(step % loader.num_batches());
        zero.zero_grad();
        torch::nn::functional::cross_entropy(model->forward(batch.input().to(device)), batch.target().to(device))
            .backward();
        grads = static_cast<double>(zero.local_gradient_bytes());
        zero.step();
      }
      const auto& local = dynamic_cast<trainkit::optim::OffloadOptimizer&>(*zero.local_optimizer());
      const double state = static_cast<double>(zero.local_state_bytes());
      const double buffers = static_cast<double>(local.host_buffer_bytes());
      for (int64_t r = 0; r < world; ++r) {
        pg->barrier();
        if (r == rank) {
          std::printf("stage 2 + offload rank %lld: on the device gradients %.2f MiB, optimizer state 0 MiB: %.1f%% of "
                      "the unsharded %.2f MiB; on the host Adam state %.2f MiB + masters and gradient buffers %.2f MiB\n",
                      static_cast<long long>(rank), grads / 1048576.0, 100.0 * grads / (full_grads + full_state),
                      (full_grads + full_state) / 1048576.0, state / 1048576.0, buffers / 1048576.0);
          std::fflush(stdout);
        }
      }
      double offload_diff = 0;
      const auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        offload_diff = std::max(offload_diff, (params[i].detach() - finals[1][i]).abs().max().item<double>());
      }
      if (pg->is_main()) {
        std::printf("largest parameter difference between stage 2 with and without offload: %.3g\n", offload_diff);
      }
      if (!(offload_diff < 1e-4)) {
        std::fprintf(stderr, "zero: offload trained another model (difference %g)\n", offload_diff);
        return 1;
      }
    }
    double diff = 0;
    for (size_t i = 0; i < finals[0].size(); ++i) {
      diff = std::max(diff, (finals[0][i] - finals[1][i]).abs().max().item<double>());
    }
    if (pg->is_main()) {
      std::printf("largest parameter difference between stage 1 and stage 2: %.3g (float32 sums in another order)\n", diff);
    }
    if (!(diff < 1e-4)) {
      std::fprintf(stderr, "zero: stages 1 and 2 trained different models (difference %g)\n", diff);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero: rank %lld: %s\n", static_cast<long long>(rank), e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  return 0;
}
