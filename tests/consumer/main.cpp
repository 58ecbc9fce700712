// Uses an installed trainkit: builds a model, trains a few steps with the Trainer, checkpoints it, and
// exports weights-only (argv[1]) for load_weights, which links only LibTorch.
#include <cstdio>
#include <filesystem>

#include <torch/torch.h>
#include <trainkit/trainkit.h>

int main(int argc, char** argv) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({64, 1, 8, 8});
  const at::Tensor y = (x.sum({1, 2, 3}) > 0).to(torch::kInt64);
  trainkit::data::TensorLoader loader(x, y, trainkit::data::TensorLoaderOptions().batch_size(16));
  auto model = trainkit::nn::make_cnn(trainkit::nn::CnnOptions().image_size(8).channels({4}).hidden(8).num_classes(2));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));
  trainkit::train::Trainer trainer(model, optimizer, trainkit::train::TrainerOptions().epochs(2));
  trainer.fit(loader);
  const auto path = (std::filesystem::temp_directory_path() / "trainkit-consumer.tkpt").string();
  torch::serialize::OutputArchive out;
  trainer.save(out);
  trainkit::train::save_checkpoint(path, out);
  torch::serialize::InputArchive in;
  trainkit::train::load_checkpoint(path, in);
  std::filesystem::remove(path);
  // A weights-only export (ModelCheckpoint's format) for the plain-LibTorch load_weights program.
  torch::nn::Sequential plain(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
  {
    torch::NoGradGuard no_grad;
    double value = 0;
    for (auto& p : plain->parameters()) {
      p.fill_(++value);
    }
  }
  const std::string weights = argc > 1 ? argv[1] : "weights.pt";
  trainkit::train::save_weights(*plain, weights);
  std::printf("trainkit %s consumer: %lld steps, LibTorch %s\n", TRAINKIT_VERSION,
              static_cast<long long>(trainer.state().step), trainkit::compat::torch_version().c_str());
  return trainer.state().step == 8 ? 0 : 1;
}
