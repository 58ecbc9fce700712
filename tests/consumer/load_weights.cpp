// Plain LibTorch, no trainkit: loads the weights-only file the consumer wrote with
// trainkit::train::save_weights (ModelCheckpoint's format) using torch::load, and checks the values.
#include <cstdio>

#include <torch/torch.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: load_weights FILE\n");
    return 2;
  }
  torch::nn::Sequential model(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
  torch::load(model, argv[1]);
  // The consumer filled parameter i with the value i + 1.
  int64_t i = 0;
  for (const auto& p : model->parameters()) {
    if (!torch::equal(p, torch::full_like(p, static_cast<double>(++i)))) {
      std::fprintf(stderr, "parameter %lld differs\n", static_cast<long long>(i - 1));
      return 1;
    }
  }
  std::printf("plain LibTorch loaded %lld parameters from %s\n", static_cast<long long>(i), argv[1]);
  return 0;
}
