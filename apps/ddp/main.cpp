// ddp: the Fashion-MNIST CNN trained data-parallel. Run it under the launcher or torchrun:
//   trainkit launch --nproc 2 -- build/apps/ddp --epochs 1
//   torchrun --nproc-per-node 2 --no-python build/apps/ddp --epochs 1
// Alone (no RANK/WORLD_SIZE) it trains in one process. Each rank reads its own shard of every epoch
// (TensorLoader's num_replicas/rank); --batch-size is the global batch, split evenly over the ranks, so any
// world size trains the same model. Rank 0 alone prints and writes the checkpoint; at the end every rank
// prints a digest of its parameters (train::digest_parameters), equal on every rank. --device cuda trains
// rank r on cuda:<LOCAL_RANK> (gradients through NCCL; the scalar helpers still go through Gloo).
#include <chrono>
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
#include "trainkit/nn/models.h"
#include "trainkit/train/checkpoint.h"

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"Fashion-MNIST CNN with DistributedDataParallel (run under `trainkit launch` or torchrun)"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t epochs = 1;
  int64_t batch_size = 128;
  double lr = 1e-3;
  int64_t limit_train = 0;
  double bucket_cap_mb = 25.0;
  bool no_overlap = false;
  int64_t threads = 1;
  std::string checkpoint;
  std::string device_name = "cpu";
  cli.option("--data-dir", data_dir, "Directory with the gzip'd IDX files").show_default();
  cli.option("--epochs", epochs, "Epochs").show_default().positive();
  cli.option("--batch-size", batch_size, "Global batch size (split over the ranks)").show_default().positive();
  cli.option("--lr", lr, "Adam learning rate").show_default().positive();
  cli.option("--limit-train", limit_train, "Use only the first N training examples (0 = all)").show_default();
  cli.option("--bucket-cap-mb", bucket_cap_mb, "DDP bucket cap in MiB").show_default();
  cli.flag("--no-overlap", no_overlap, "All-reduce after backward instead of from the autograd hooks");
  cli.option("--threads", threads, "Intra-op threads per rank").show_default().positive();
  cli.option("--checkpoint", checkpoint, "Rank 0 writes the model here (atomically) after each epoch");
  cli.option("--device", device_name,
             "cpu, cuda (rank r of a launch on cuda:<LOCAL_RANK>, one process on cuda:0) or cuda:<index> (one "
             "process only)")
      .show_default();
  if (auto rc = cli.parse(argc, argv)) return *rc;
  if (!std::regex_match(device_name, std::regex("cpu|cuda(:[0-9]+)?"))) {
    std::fprintf(stderr, "ddp: --device '%s' is not cpu, cuda or cuda:<index>\n", device_name.c_str());
    return 2;
  }
  const int64_t gpus = device_name == "cpu" ? 0 : static_cast<int64_t>(torch::cuda::device_count());
  if (device_name != "cpu" && gpus == 0) {
    std::fprintf(stderr, "ddp: --device %s: no CUDA device is available\n", device_name.c_str());
    return 2;
  }

  int64_t rank = 0;
  try {
    torch::set_num_threads(static_cast<int>(threads));
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
    if (batch_size % world != 0) {
      std::fprintf(stderr, "ddp: --batch-size %lld is not divisible by WORLD_SIZE=%lld\n",
                   static_cast<long long>(batch_size), static_cast<long long>(world));
      return 2;
    }
    const auto train = trainkit::data::load_mnist_split(data_dir, true, limit_train);
    const auto test = trainkit::data::load_mnist_split(data_dir, false);
    trainkit::data::TensorLoader loader(train.images, train.labels,
                                        trainkit::data::TensorLoaderOptions()
                                            .batch_size(batch_size / world)
                                            .seed(0)
                                            .num_replicas(world)
                                            .rank(rank));
    torch::manual_seed(0);
    auto model = trainkit::nn::make_cnn();
    model->to(device);
    trainkit::dist::DistributedDataParallel ddp(
        model.ptr(), pg,
        trainkit::dist::DistributedDataParallelOptions().bucket_cap_mb(bucket_cap_mb).overlap(!no_overlap));
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(lr));
    if (pg->is_main()) {
      std::printf("ddp: %lld rank(s) on %s, %lld thread(s) each, global batch %lld, %zu bucket(s), overlap %s\n",
                  static_cast<long long>(world), device.str().c_str(), static_cast<long long>(threads),
                  static_cast<long long>(batch_size), ddp.bucket_indices().size(), no_overlap ? "off" : "on");
    }

    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      pg->barrier();
      const auto start = std::chrono::steady_clock::now();
      model->train();
      loader.set_epoch(epoch);
      at::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
      for (int64_t b = 0; b < loader.num_batches(); ++b) {
        const auto batch = loader.batch(b);
        optimizer.zero_grad();
        ddp.sync_buffers();
        const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(batch.input().to(device)),
                                                                     batch.target().to(device));
        loss.backward();  // gradients are averaged over the ranks when this returns
        optimizer.step();
        loss_sum += loss.detach().to(torch::kFloat64);
      }
      pg->barrier();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double samples = static_cast<double>(loader.num_batches() * batch_size);

      // Each rank evaluates its own slice of the test set; the accuracy is the mean over ranks.
      model->eval();
      torch::NoGradGuard no_grad;
      const int64_t n_test = test.images.size(0);
      const int64_t begin = n_test * rank / world;
      const int64_t end = n_test * (rank + 1) / world;
      int64_t correct = 0;
      for (int64_t row = begin; row < end; row += 1000) {
        const int64_t rows = std::min<int64_t>(1000, end - row);
        correct += model->forward(test.images.narrow(0, row, rows).to(device))
                       .argmax(1)
                       .eq(test.labels.narrow(0, row, rows).to(device))
                       .sum()
                       .item<int64_t>();
      }
      const double total_correct = pg->all_reduce_sum(static_cast<double>(correct));
      const double mean_loss =
          pg->all_reduce_mean(loss_sum.item<double>() / static_cast<double>(loader.num_batches()));
      if (pg->is_main()) {
        std::printf("epoch %lld: train loss %.4f, test accuracy %.4f, %.1f s, %.0f samples/s\n",
                    static_cast<long long>(epoch + 1), mean_loss, total_correct / static_cast<double>(n_test), seconds,
                    samples / seconds);
        std::fflush(stdout);
        if (!checkpoint.empty()) {
          torch::serialize::OutputArchive archive;
          model->save(archive);
          trainkit::train::save_checkpoint(checkpoint, archive);
        }
      }
    }
    // DDP keeps the replicas bitwise equal: every rank prints its digest, and the digests must agree.
    std::printf("rank %lld: parameter digest %016llx\n", static_cast<long long>(rank),
                static_cast<unsigned long long>(trainkit::train::digest_parameters(*model)));
    std::fflush(stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp: rank %lld: %s\n", static_cast<long long>(rank), e.what());
    std::fflush(stderr);
    std::_Exit(1);  // a c10d backend whose peer is gone may block in its destructor
  }
  return 0;
}
