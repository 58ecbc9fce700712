// grad_clip: an LSTM on the adding problem (Hochreiter & Schmidhuber 1997: sum the two marked numbers of a
// long sequence) trained with a high learning rate, with and without gradient-norm clipping, from the same
// initial weights and data. Prints the loss and gradient-norm curves and writes them as CSV and SVG.
#include <cmath>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/grad/clip.h"
#include "trainkit/log/svg_plot.h"

namespace {

struct AddingModel : torch::nn::Module {
  torch::nn::LSTM lstm{nullptr};
  torch::nn::Linear head{nullptr};
  explicit AddingModel(int64_t hidden) {
    lstm = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(2, hidden).batch_first(true)));
    head = register_module("head", torch::nn::Linear(hidden, 1));
  }
  at::Tensor forward(const at::Tensor& x) {
    const auto out = std::get<0>(lstm->forward(x));
    return head->forward(out.select(1, -1)).squeeze(1);
  }
};

/// A batch of the adding problem: inputs [B, T, 2] (value, marker), targets [B].
std::pair<at::Tensor, at::Tensor> adding_batch(int64_t batch, int64_t length, torch::Generator& gen) {
  const at::Tensor values = torch::rand({batch, length}, gen);
  at::Tensor markers = torch::zeros({batch, length});
  const at::Tensor first = torch::randint(0, length / 2, {batch}, gen);
  const at::Tensor second = torch::randint(length / 2, length, {batch}, gen);
  const at::Tensor rows = torch::arange(batch);
  markers.index_put_({rows, first}, 1.0);
  markers.index_put_({rows, second}, 1.0);
  return {torch::stack({values, markers}, 2), (values * markers).sum(1)};
}

struct Curve {
  std::vector<double> step, loss, grad_norm;
};

Curve train(double clip, int64_t steps, int64_t length, double lr, int64_t hidden) {
  torch::manual_seed(0);
  auto model = std::make_shared<AddingModel>(hidden);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(lr));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  Curve c;
  for (int64_t s = 1; s <= steps; ++s) {
    const auto [x, y] = adding_batch(32, length, gen);
    opt.zero_grad();
    const at::Tensor loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    // The norm before clipping is what explodes; clip_grad_norm_ returns it either way.
    const double norm = clip > 0 ? trainkit::grad::clip_grad_norm_(model->parameters(), clip).item<double>()
                                 : trainkit::grad::grad_norm(model->parameters()).item<double>();
    opt.step();
    c.step.push_back(static_cast<double>(s));
    c.loss.push_back(loss.item<double>());
    c.grad_norm.push_back(norm);
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{
      "LSTM on the adding problem with and without gradient clipping (loss and gradient-norm curves)"};
  int64_t steps = 240;
  int64_t length = 100;
  double lr = 1.0;
  double clip = 0.5;
  int64_t hidden = 32;
  std::string out_prefix;
  cli.option("--steps", steps, "Optimizer steps per run").show_default().positive();
  cli.option("--length", length, "Sequence length").show_default().range(4, 10000);
  cli.option("--lr", lr, "SGD learning rate (high, to provoke explosions)").show_default();
  cli.option("--clip", clip, "max_norm of the clipped run").show_default().positive();
  cli.option("--hidden", hidden, "LSTM hidden size").show_default();
  cli.option("--out", out_prefix, "Write PREFIX.csv, PREFIX_loss.svg and PREFIX_grad_norm.svg");
  if (auto rc = cli.parse(argc, argv)) return *rc;

  const Curve plain = train(0.0, steps, length, lr, hidden);
  const Curve clipped = train(clip, steps, length, lr, hidden);
  const auto summary = [](const Curve& c, size_t from, size_t to) {
    double loss = 0;
    double max_norm = 0;
    int nonfinite = 0;
    for (size_t i = from; i < to; ++i) {
      if (!std::isfinite(c.loss[i])) {
        ++nonfinite;
        continue;
      }
      loss += c.loss[i];
      max_norm = std::max(max_norm, c.grad_norm[i]);
    }
    return std::make_tuple(loss / static_cast<double>(to - from - static_cast<size_t>(nonfinite)), max_norm, nonfinite);
  };
  fmt::print("adding problem, length {}, SGD lr {}, {} steps (a constant predictor of 1.0 has loss ~0.167)\n", length,
             lr, steps);
  fmt::print("{:>12} {:<28} {}\n", "steps", "no clipping: loss, max |g|", fmt::format("clip {}: loss, max |g|", clip));
  const size_t chunk = std::max<size_t>(1, static_cast<size_t>(steps) / 8);
  for (size_t from = 0; from < plain.step.size(); from += chunk) {
    const size_t to = std::min(plain.step.size(), from + chunk);
    const auto [la, na, fa] = summary(plain, from, to);
    const auto [lb, nb, fb] = summary(clipped, from, to);
    const auto cell = [](double loss, double norm, int nonfinite, size_t n) {
      if (nonfinite == static_cast<int>(n)) {
        return std::string("   diverged (NaN loss)");
      }
      return fmt::format("{:>10.4g} {:>10.3g}{}", loss, norm, nonfinite > 0 ? fmt::format(" ({} NaN)", nonfinite) : "");
    };
    fmt::print("{:>5}-{:<6} {:<28} {}\n", from + 1, to, cell(la, na, fa, to - from), cell(lb, nb, fb, to - from));
  }
  if (!out_prefix.empty()) {
    std::ofstream csv(out_prefix + ".csv");
    csv << "step,loss_plain,grad_norm_plain,loss_clipped,grad_norm_clipped\n";
    for (size_t i = 0; i < plain.step.size(); ++i) {
      csv << fmt::format("{},{},{},{},{}\n", plain.step[i], plain.loss[i], plain.grad_norm[i], clipped.loss[i],
                         clipped.grad_norm[i]);
    }
    for (const auto& [what, log_y] : {std::pair<std::string, bool>{"loss", true}, {"grad_norm", true}}) {
      trainkit::log::SvgPlot plot(
          trainkit::log::PlotOptions()
              .title(fmt::format("LSTM, adding problem (T = {}), SGD lr {}: {}", length, lr, what))
              .x_label("step")
              .y_label(what == "loss" ? "training loss (MSE)" : "gradient norm before clipping")
              .log_y(log_y));
      plot.add_series({"no clipping", plain.step, what == "loss" ? plain.loss : plain.grad_norm, false});
      plot.add_series({fmt::format("clip_grad_norm_ {}", clip), clipped.step,
                       what == "loss" ? clipped.loss : clipped.grad_norm, false});
      plot.save(out_prefix + "_" + what + ".svg");
    }
    fmt::print("wrote {0}.csv, {0}_loss.svg, {0}_grad_norm.svg\n", out_prefix);
  }
  return 0;
}
