// zero: optimizer-state memory per rank with ZeRO stage 1. Trains an MLP on Fashion-MNIST with
// DistributedDataParallel and a ZeroRedundancyOptimizer(Adam) under the launcher, then prints for every rank
// the parameters it owns and the bytes of Adam state it holds, against one unsharded Adam:
//   trainkit launch --nproc 2 -- build/apps/zero --steps 20
#include <cstdio>

#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/dist/zero.h"
#include "trainkit/nn/models.h"

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"ZeRO-1: Adam state memory per rank vs unsharded (run under `trainkit launch` or torchrun)"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t steps = 20;
  int64_t batch_size = 128;
  int64_t hidden = 1024;
  double lr = 1e-3;
  cli.option("--data-dir", data_dir, "Directory with the gzip'd IDX files").show_default();
  cli.option("--steps", steps, "Optimizer steps").show_default().positive();
  cli.option("--batch-size", batch_size, "Global batch size").show_default().positive();
  cli.option("--hidden", hidden, "Width of the MLP's two hidden layers").show_default().positive();
  cli.option("--lr", lr, "Adam learning rate").show_default().positive();
  if (auto rc = cli.parse(argc, argv)) return *rc;

  int64_t rank = 0;
  try {
    torch::set_num_threads(1);
    auto pg = trainkit::dist::ProcessGroup::from_env();
    rank = pg->rank();
    const int64_t world = pg->world_size();
    const auto train = trainkit::data::load_mnist_split(data_dir, true, steps * batch_size);
    trainkit::data::TensorLoader loader(
        train.images, train.labels,
        trainkit::data::TensorLoaderOptions().batch_size(std::max<int64_t>(1, batch_size / world)).num_replicas(world).rank(rank));
    torch::manual_seed(0);
    auto model = trainkit::nn::make_mlp(trainkit::nn::MlpOptions().hidden({hidden, hidden}));
    trainkit::dist::DistributedDataParallel ddp(model.ptr(), pg);
    trainkit::dist::ZeroRedundancyOptimizer zero(
        model->parameters(), pg, [lr](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
          return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
        });
    double loss_sum = 0;
    for (int64_t step = 0; step < steps; ++step) {
      const auto batch = loader.batch(step % loader.num_batches());
      zero.zero_grad();
      const auto loss = torch::nn::functional::cross_entropy(model->forward(batch.input()), batch.target());
      loss.backward();
      zero.step();
      loss_sum += loss.item<double>();
    }
    const double mean_loss = pg->all_reduce_mean(loss_sum / static_cast<double>(steps));
    // The unsharded reference: one Adam over all parameters of a copy, stepped once (its state is then
    // allocated in full).
    auto copy = trainkit::nn::make_mlp(trainkit::nn::MlpOptions().hidden({hidden, hidden}));
    for (auto& p : copy->parameters()) p.mutable_grad() = torch::zeros_like(p);
    torch::optim::Adam full(copy->parameters(), torch::optim::AdamOptions(lr));
    full.step();
    const double full_bytes = static_cast<double>(trainkit::dist::optimizer_state_bytes(full));
    const double mine = static_cast<double>(zero.local_state_bytes());
    const double total = pg->all_reduce_sum(mine);
    for (int64_t r = 0; r < world; ++r) {
      pg->barrier();
      if (r == rank) {
        std::printf("rank %lld: %zu of %zu parameter tensors, Adam state %.2f MiB (%.1f%% of unsharded %.2f MiB)\n",
                    static_cast<long long>(rank), zero.shard(rank).size(), model->parameters().size(), mine / 1048576.0,
                    100.0 * mine / full_bytes, full_bytes / 1048576.0);
        std::fflush(stdout);
      }
    }
    if (pg->is_main()) {
      std::printf("%lld rank(s): all shards together %.2f MiB; mean training loss over %lld steps %.4f\n",
                  static_cast<long long>(world), total / 1048576.0, static_cast<long long>(steps), mean_loss);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero: rank %lld: %s\n", static_cast<long long>(rank), e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  return 0;
}
