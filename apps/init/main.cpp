// init: why the initialization's scale matters. Part 1 pushes a batch of N(0, 1) inputs through 30 square
// linear layers (no bias) with ReLU or tanh and prints the activations' standard deviation at depth under
// LeCun init (std 1/√fan_in, which the notes call he_init), He (Kaiming normal, ReLU gain √2), Xavier normal
// and LibTorch's default (Kaiming uniform with a = √5, std 1/√(3·fan_in)): the scale either holds, vanishes
// or explodes geometrically with depth. Part 2 trains the main CNN (nn::make_cnn) on Fashion-MNIST for 200
// SGD steps under each scheme, from the same data order, and prints the training loss.
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/data/idx.h"
#include "trainkit/nn/init.h"
#include "trainkit/nn/models.h"

namespace init = trainkit::nn::init;

namespace {

struct Scheme {
  std::string label;
  std::string name;  // nn::init::scheme name
};

const std::vector<Scheme>& schemes() {
  static const std::vector<Scheme> all = {{"LeCun (notes' he_init)", "lecun_normal"},
                                          {"He / Kaiming normal", "kaiming_normal"},
                                          {"Xavier normal", "xavier_normal"},
                                          {"LibTorch default", "default"}};
  return all;
}

/// The activations' std after each of `depth` Linear(width, width, bias=false) + nonlinearity layers.
std::vector<double> activation_stds(const std::string& scheme, const std::string& nonlinearity, int64_t depth,
                                    int64_t width, int64_t batch) {
  torch::manual_seed(0);
  torch::nn::Sequential layers;
  for (int64_t i = 0; i < depth; ++i) {
    layers->push_back(torch::nn::Linear(torch::nn::LinearOptions(width, width).bias(false)));
  }
  init::apply(*layers, init::scheme(scheme));
  torch::NoGradGuard no_grad;
  at::Tensor h = torch::randn({batch, width});
  std::vector<double> stds;
  for (auto& layer : *layers) {
    h = layer.forward(h);
    h = nonlinearity == "relu" ? torch::relu(h) : torch::tanh(h);
    stds.push_back(h.std().item<double>());
  }
  return stds;
}

/// Training losses of make_cnn (no batch norm: it would rescale every layer's output and hide the init) under
/// `scheme`, SGD with momentum, the same batches for every scheme.
std::vector<double> train_losses(const std::string& scheme, const trainkit::data::ImageSet& data, int64_t steps,
                                 int64_t batch, double lr) {
  torch::manual_seed(0);
  auto net = trainkit::nn::make_cnn(trainkit::nn::CnnOptions().batch_norm(false).dropout(0.0));
  init::apply(*net, init::scheme(scheme));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  const int64_t n = data.images.size(0);
  std::vector<double> losses;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t start = (s * batch) % (n - batch + 1);
    const at::Tensor x = data.images.narrow(0, start, batch);
    const at::Tensor y = data.labels.narrow(0, start, batch);
    opt.zero_grad();
    const at::Tensor loss = torch::cross_entropy_loss(net->forward(x), y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

std::string cell(double v) {
  if (!std::isfinite(v)) {
    return "nan";
  }
  return fmt::format("{:.3g}", v);
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "Activation std through 30 layers and the CNN's first training steps under LeCun, He, Xavier and "
      "LibTorch's default initialization"};
  int64_t depth = 30;
  int64_t width = 512;
  int64_t steps = 200;
  int64_t batch = 64;
  double lr = 0.01;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  cli.option("--depth", depth, "Layers of the activation experiment").show_default().positive();
  cli.option("--width", width, "Layer width of the activation experiment").show_default().positive();
  cli.option("--steps", steps, "CNN training steps per scheme (0 = skip the CNN)").show_default();
  cli.option("--batch", batch, "CNN batch size").show_default().positive();
  cli.option("--lr", lr, "CNN SGD learning rate (momentum 0.9)").show_default();
  cli.option("--data-dir", data_dir, "Fashion-MNIST IDX files").show_default();
  if (auto rc = cli.parse(argc, argv)) return *rc;

  std::vector<int64_t> shown;
  for (const int64_t d : {1, 2, 5, 10, 20, 30, 50, 100}) {
    if (d <= depth) {
      shown.push_back(d);
    }
  }
  if (shown.empty() || shown.back() != depth) {
    shown.push_back(depth);
  }
  for (const std::string nonlinearity : {"relu", "tanh"}) {
    fmt::print("activation std after k layers of Linear({0}, {0}, bias=false) + {1}, input N(0, 1), batch 1000\n",
               width, nonlinearity);
    fmt::print("{:<24}", "init \\ k");
    for (const int64_t d : shown) {
      fmt::print(" {:>9}", d);
    }
    fmt::print("\n");
    for (const auto& s : schemes()) {
      const auto stds = activation_stds(s.name, nonlinearity, depth, width, 1000);
      fmt::print("{:<24}", s.label);
      for (const int64_t d : shown) {
        fmt::print(" {:>9}", cell(stds[static_cast<size_t>(d - 1)]));
      }
      fmt::print("\n");
    }
    fmt::print("\n");
  }
  if (steps <= 0) {
    return 0;
  }
  const int64_t needed = std::max<int64_t>(steps * batch, batch);
  const auto data = trainkit::data::load_mnist_split(data_dir, true, std::min<int64_t>(needed, 60000));
  fmt::print("make_cnn (channels 32, 64, hidden 128, no batch norm, no dropout) on Fashion-MNIST: training loss, "
             "mean over each window of steps (SGD lr {}, momentum 0.9, batch {}; same batches for every init)\n",
             lr, batch);
  std::vector<std::pair<int64_t, int64_t>> windows;
  for (const auto& [from, to] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 10}, {11, 25}, {26, 50},
                                                                          {51, 100}, {101, 150}, {151, 200}}) {
    if (from <= steps) {
      windows.emplace_back(from, std::min(to, steps));
    }
  }
  fmt::print("{:<24}", "init \\ steps");
  for (const auto& [from, to] : windows) {
    fmt::print(" {:>9}", from == to ? fmt::format("{}", from) : fmt::format("{}-{}", from, to));
  }
  fmt::print("\n");
  for (const auto& s : schemes()) {
    const auto losses = train_losses(s.name, data, steps, batch, lr);
    fmt::print("{:<24}", s.label);
    for (const auto& [from, to] : windows) {
      double sum = 0;
      for (int64_t i = from; i <= to; ++i) {
        sum += losses[static_cast<size_t>(i - 1)];
      }
      fmt::print(" {:>9}", cell(sum / static_cast<double>(to - from + 1)));
    }
    fmt::print("\n");
    std::fflush(stdout);
  }
  return 0;
}
