// hand_loop: Fashion-MNIST trained by a plain, hand-written LibTorch loop that uses trainkit's pieces
// (IDX reader, preloaded loader, model, atomic checkpoints) without the Trainer. Every trainkit technique
// is usable this way; the Trainer only packages the same loop with hooks.
#include <chrono>
#include <cstdio>

#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/main.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/nn/models.h"
#include "trainkit/train/checkpoint.h"

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"Train the Fashion-MNIST CNN with a hand-written LibTorch loop built from trainkit's pieces"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t epochs = 2;
  int64_t batch_size = 128;
  double lr = 1e-3;
  int64_t limit_train = 0;
  std::string checkpoint;
  cli.option("--data-dir", data_dir, "Directory with the gzip'd IDX files").show_default();
  cli.option("--epochs", epochs, "Epochs").show_default().positive();
  cli.option("--batch-size", batch_size, "Batch size").show_default().positive();
  cli.option("--lr", lr, "Adam learning rate").show_default().positive();
  cli.option("--limit-train", limit_train, "Use only the first N training examples (0 = all)").show_default();
  cli.option("--checkpoint", checkpoint, "Write the model and optimizer here (atomically) after each epoch");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");

  return trainkit::app::run_main([&] {
    const auto train = trainkit::data::load_mnist_split(data_dir, true, limit_train);
    const auto test = trainkit::data::load_mnist_split(data_dir, false);
    trainkit::data::TensorLoader loader(train.images, train.labels,
                                        trainkit::data::TensorLoaderOptions().batch_size(batch_size).seed(0));
    torch::manual_seed(0);
    auto model = trainkit::nn::make_cnn();
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(lr));

    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      const auto start = std::chrono::steady_clock::now();
      model->train();
      loader.set_epoch(epoch);
      at::Tensor loss_sum = torch::zeros({}, torch::kFloat64);
      for (int64_t b = 0; b < loader.num_batches(); ++b) {
        const auto batch = loader.batch(b);
        optimizer.zero_grad();
        const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(batch.input()), batch.target());
        loss.backward();
        optimizer.step();
        loss_sum += loss.detach().to(torch::kFloat64);
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

      model->eval();
      torch::NoGradGuard no_grad;
      int64_t correct = 0;
      for (int64_t start_row = 0; start_row < test.images.size(0); start_row += 1000) {
        const int64_t rows = std::min<int64_t>(1000, test.images.size(0) - start_row);
        const at::Tensor predicted = model->forward(test.images.narrow(0, start_row, rows)).argmax(1);
        correct += predicted.eq(test.labels.narrow(0, start_row, rows)).sum().item<int64_t>();
      }
      const double accuracy = static_cast<double>(correct) / static_cast<double>(test.images.size(0));
      std::printf("epoch %lld: train loss %.4f, test accuracy %.4f, %.1f s (%.0f samples/s)\n",
                  static_cast<long long>(epoch + 1), loss_sum.item<double>() / static_cast<double>(loader.num_batches()),
                  accuracy, seconds, static_cast<double>(loader.size()) / seconds);

      if (!checkpoint.empty()) {
        torch::serialize::OutputArchive archive;
        model->save(archive);
        torch::serialize::OutputArchive optim_archive;
        optimizer.save(optim_archive);
        archive.write("optimizer", optim_archive);
        trainkit::train::save_checkpoint(checkpoint, archive);
      }
    }
    return 0;
  });
}
