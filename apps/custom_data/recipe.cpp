// The code block of docs/training.md's section "The recipe with the library alone" is the region between the
// two marker lines below, byte for byte: the ctest docs_recipe (scripts/check_docs_recipe.sh) compares them,
// and app_smoke_custom_data_recipe runs it. Edit both together.
#include "recipe.h"

// docs recipe begin
#include <torch/torch.h>
#include <trainkit/trainkit.h>
namespace tk = trainkit;

// Your own dataset and module, as in any LibTorch project.
struct Rows : torch::data::datasets::Dataset<Rows> {
  torch::Tensor x, y;
  Rows(torch::Tensor x, torch::Tensor y) : x(std::move(x)), y(std::move(y)) {}
  torch::data::Example<> get(size_t i) override { return {x[i], y[i]}; }
  torch::optional<size_t> size() const override { return x.size(0); }
};
struct MlpImpl : torch::nn::Module {
  torch::nn::Linear hidden{nullptr}, out{nullptr};
  explicit MlpImpl(int64_t in)
      : hidden(register_module("hidden", torch::nn::Linear(in, 64))),
        out(register_module("out", torch::nn::Linear(64, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::relu(hidden(x))); }
};
TORCH_MODULE(Mlp);

double fit_regression(torch::Tensor x, torch::Tensor y, torch::Tensor val_x, torch::Tensor val_y, int64_t epochs) {
  auto loader = torch::data::make_data_loader(Rows(x, y).map(torch::data::transforms::Stack<>()),
      torch::data::samplers::RandomSampler(x.size(0)), torch::data::DataLoaderOptions().batch_size(32));
  auto train = tk::data::from_torch_data(*loader, tk::data::TorchDataOptions().seed(0));  // a BatchSource
  auto val = tk::data::from_batches({tk::data::Batch(val_x, val_y)});
  Mlp model(x.size(1));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  tk::tune::LRFinder finder(model, optimizer, tk::train::mse_loss());  // restores model and optimizer after
  const auto suggestion = tk::tune::suggest_valley(finder.range_test(train));
  const double lr = suggestion ? suggestion->lr : 1e-3;
  tk::train::Trainer trainer(model, optimizer, tk::train::TrainerOptions().epochs(epochs));
  trainer.set_loss(tk::train::mse_loss());
  trainer.set_metrics({tk::train::mean_squared_error(), tk::train::mean_absolute_error()});
  const int64_t steps_per_epoch = (x.size(0) + 31) / 32;
  trainer.set_scheduler(std::make_shared<tk::sched::OneCycleLR>(optimizer,
      tk::sched::OneCycleLROptions({lr}).epochs(epochs).steps_per_epoch(steps_per_epoch)), /*per_step=*/true);
  trainer.fit(train, &val);
  return trainer.evaluate(val).metric("mse");
}
// docs recipe end
