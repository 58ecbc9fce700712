// zero: parameter, gradient and optimizer-state memory per rank with plain DDP (stage 0) and ZeRO stages 1, 2
// and 3. Trains an MLP on Fashion-MNIST under the launcher with Adam, once per stage (stage 3: each Linear a
// unit of a FullyShardedDataParallel), then prints for every rank the parameters it owns and the bytes of
// parameters, gradients and Adam state it holds, against the unsharded run, and checks that every stage
// trained the same model:
//   trainkit launch --nproc 2 -- build/apps/zero --steps 20
// --offload also trains stages 0-3 with each rank's Adam on the host (optim::OffloadOptimizer) and prints what
// stays on the device and what moved to the host.
// --device cuda trains rank r on cuda:<LOCAL_RANK>: ZeRO's reduces and broadcasts then go through NCCL,
// the loss mean and the barriers through Gloo.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/run.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/fully_shard.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/dist/zero.h"
#include "trainkit/nn/models.h"
#include "trainkit/optim/offload.h"

namespace {

/// `bytes` as "<x.xx> MiB".
std::string fmt_mib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f MiB", bytes / 1048576.0);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"DDP and ZeRO stages 1-3: parameter, gradient and Adam state memory per rank vs unsharded (run under `trainkit launch` or torchrun)"};
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
  cli.flag("--offload", offload,
           "Also train stages 0-3 with each rank's Adam offloaded to the host (optim::OffloadOptimizer)");
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
    double full_params = 0;
    for (const auto& p : copy->parameters()) full_params += static_cast<double>(p.nbytes());
    const double unsharded = full_params + full_grads + full_state;
    // Every run's optimizer: Adam over the one param group it is given (ZeRO's shard, or all parameters), on the
    // host when offloaded.
    const trainkit::optim::HostOptimizerFactory adam =
        [lr](std::vector<torch::optim::OptimizerParamGroup> groups) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<torch::optim::Adam>(groups.front().params(), torch::optim::AdamOptions(lr));
    };
    struct Setup {
      int64_t stage;
      bool offload;
      std::string name() const { return "stage " + std::to_string(stage) + (offload ? " + offload" : ""); }
    };
    std::vector<Setup> setups;
    for (const bool host : {false, true}) {
      for (int64_t stage = 0; stage <= 3 && (offload || !host); ++stage) setups.push_back({stage, host});
    }
    std::vector<std::vector<at::Tensor>> finals;  // rank 0: each run's final parameters
    for (const Setup& setup : setups) {
      torch::manual_seed(0);
      auto model = trainkit::nn::make_mlp(trainkit::nn::MlpOptions().hidden({hidden, hidden}));
      model->to(device);
      const std::vector<torch::optim::OptimizerParamGroup> groups = {
          torch::optim::OptimizerParamGroup(model->parameters())};
      const trainkit::optim::HostOptimizerFactory factory =
          setup.offload ? trainkit::optim::offloaded(adam) : adam;
      // Stage 0: DDP and Adam (offloaded: an OffloadOptimizer over all parameters); 1-2: DDP and ZeRO, whose
      // shard's optimizer the factory makes; 3: FullyShardedDataParallel (its own DDP and ZeRO).
      std::unique_ptr<trainkit::dist::DistributedDataParallel> ddp;
      std::unique_ptr<trainkit::dist::FullyShardedDataParallel> fsdp;
      std::unique_ptr<torch::optim::Optimizer> plain;
      std::unique_ptr<trainkit::dist::ZeroRedundancyOptimizer> zero;
      if (setup.stage == 3) {
        fsdp = std::make_unique<trainkit::dist::FullyShardedDataParallel>(
            model.ptr(), trainkit::dist::sequential_units(model), pg, groups, factory);
      } else {
        ddp = std::make_unique<trainkit::dist::DistributedDataParallel>(model.ptr(), pg);
        if (setup.stage == 0) {
          plain = setup.offload ? std::make_unique<trainkit::optim::OffloadOptimizer>(groups, adam) : adam(groups);
        } else {
          zero = std::make_unique<trainkit::dist::ZeroRedundancyOptimizer>(
              *ddp, groups, factory, trainkit::dist::ZeroOptions().stage(setup.stage));
        }
      }
      torch::optim::Optimizer& opt = fsdp ? fsdp->optimizer() : zero ? *zero : *plain;
      // The optimizer that steps this rank's parameters: its state is on the device, or on the host.
      torch::optim::Optimizer& stepping =
          fsdp ? *fsdp->optimizer().local_optimizer() : zero ? *zero->local_optimizer() : *plain;
      // What a rank holds: every parameter below stage 3; its own (between passes) at stage 3.
      const auto parameter_bytes = [&] {
        if (fsdp) return static_cast<double>(fsdp->local_parameter_bytes());
        double bytes = 0;
        for (const auto& p : model->parameters()) bytes += static_cast<double>(p.nbytes());
        return bytes;
      };
      at::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
      double grads = 0;
      double params = 0;
      pg->barrier();
      const auto started = std::chrono::steady_clock::now();
      for (int64_t step = 0; step < steps; ++step) {
        const auto batch = loader.batch(step % loader.num_batches());
        opt.zero_grad();
        const at::Tensor x = batch.input().to(device);
        const at::Tensor logits = fsdp ? trainkit::dist::forward_sequential(*fsdp, model, x) : model->forward(x);
        const auto loss = torch::nn::functional::cross_entropy(logits, batch.target().to(device));
        loss.backward();
        // After backward: stages 2-3 hold the gradients of their shard only, stage 3 its own parameters.
        grads = 0;
        for (const auto& p : model->parameters()) grads += p.grad().defined() ? static_cast<double>(p.grad().nbytes()) : 0.0;
        params = parameter_bytes();
        opt.step();
        loss_sum += loss.detach().to(torch::kFloat64);  // on the device: no read per step
      }
      const double mean_loss = pg->all_reduce_mean(loss_sum.item<double>() / static_cast<double>(steps));
      const double ms_per_step = pg->all_reduce_mean(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count() /
          static_cast<double>(steps));
      const double state = static_cast<double>(trainkit::dist::optimizer_state_bytes(stepping));
      const auto* host = dynamic_cast<const trainkit::optim::OffloadOptimizer*>(&stepping);
      const double device_state = host != nullptr ? 0.0 : state;
      const size_t owned = fsdp ? fsdp->optimizer().shard(rank).size()
                           : zero ? zero->shard(rank).size()
                                  : model->parameters().size();
      for (int64_t r = 0; r < world; ++r) {
        pg->barrier();
        if (r == rank) {
          const std::string on_host =
              host == nullptr ? std::string()
                              : "; on the host Adam state " + fmt_mib(state) + " + masters and gradient buffers " +
                                    fmt_mib(static_cast<double>(host->host_buffer_bytes()));
          std::printf("%s rank %lld: %zu of %zu parameter tensors; parameters %.2f MiB, gradients %.2f MiB, Adam state "
                      "%.2f MiB: %.1f%% of the unsharded %.2f MiB%s\n",
                      setup.name().c_str(), static_cast<long long>(rank), owned, model->parameters().size(),
                      params / 1048576.0, grads / 1048576.0, device_state / 1048576.0,
                      100.0 * (params + grads + device_state) / unsharded, unsharded / 1048576.0, on_host.c_str());
          std::fflush(stdout);
        }
      }
      if (pg->is_main()) {
        std::printf("%s, %lld rank(s): mean training loss over %lld steps %.4f, %.1f ms per step\n",
                    setup.name().c_str(), static_cast<long long>(world), static_cast<long long>(steps), mean_loss,
                    ms_per_step);
      }
      finals.emplace_back();
      if (fsdp) {
        const auto full = fsdp->full_state_dict();  // on rank 0 only
        for (const auto& item : full) {
          if (model->named_parameters().contains(item.key())) finals.back().push_back(item.value());
        }
      } else {
        for (const auto& p : model->parameters()) finals.back().push_back(p.detach().clone());
      }
    }
    if (pg->is_main()) {
      const auto difference = [&](size_t a, size_t b) {
        double d = finals[a].size() == finals[b].size() ? 0.0 : std::numeric_limits<double>::infinity();
        for (size_t i = 0; i < finals[a].size() && i < finals[b].size(); ++i) {
          d = std::max(d, (finals[a][i] - finals[b][i]).abs().max().item<double>());
        }
        return d;
      };
      // Stages 1 and 2 sum the gradients in another order than DDP's all-reduce (float32); stage 3 reduces as
      // stage 2 does; the offload steps the same Adam on host copies.
      std::printf("largest parameter difference between stage 1 and stage 2: %.3g (float32 sums in another order)\n",
                  difference(1, 2));
      double worst = 0;
      for (size_t i = 1; i < setups.size(); ++i) {
        const double d = difference(0, i);
        std::printf("largest parameter difference between stage 0 and %s: %.3g\n", setups[i].name().c_str(), d);
        worst = std::max(worst, d);
      }
      if (!(worst < 1e-4)) {
        std::fprintf(stderr, "zero: the runs trained different models (largest difference %g)\n", worst);
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero: rank %lld: %s\n", static_cast<long long>(rank), e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  return 0;
}
