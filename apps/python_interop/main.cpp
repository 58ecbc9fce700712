// python_interop: a model written and pretrained in Python, fine-tuned in C++, evaluated back in Python.
//   1. .venv/bin/python apps/python_interop/pretrain.py --out DIR     (TorchScript: DIR/pretrained.pt)
//   2. build/apps/python_interop --model DIR/pretrained.pt --out DIR  (this program)
//   3. .venv/bin/python apps/python_interop/evaluate.py --dir DIR --expect <the accuracy printed here>
// This program loads the TorchScript model as an nn::ScriptModule, fine-tunes it on Fashion-MNIST with
// layer-wise LR decay (optim::child_layer_ids + layer_decay_groups: the head at the full LR, each layer
// below it at layer_decay times the one above), AdamW and a per-group OneCycleLR through the Trainer, and
// writes DIR/finetuned.pt (torch.jit.load) and DIR/finetuned.safetensors (into the Python class).
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/main.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/io/safetensors.h"
#include "trainkit/nn/script_module.h"
#include "trainkit/optim/adam.h"
#include "trainkit/optim/param_groups.h"
#include "trainkit/sched/cyclic.h"
#include "trainkit/train/trainer.h"

namespace {

namespace tk = trainkit;

struct Options {
  std::string model;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t epochs = 2;
  int64_t limit_train = 0;
  int64_t val_size = 5000;
  int64_t batch_size = 128;
  double lr = 3e-3;
  double layer_decay = 0.5;
  double weight_decay = 0.01;
  int64_t seed = 0;
  std::string out;
};

tk::data::ImageSet slice(const tk::data::ImageSet& s, int64_t start, int64_t n) {
  return {s.images.narrow(0, start, n), s.labels.narrow(0, start, n)};
}

int run(const Options& o) {
  tk::nn::ScriptModule model(tk::nn::ScriptModuleImpl::load(o.model));
  const tk::data::ImageSet all = tk::data::load_mnist_split(o.data_dir, true, o.limit_train);
  const int64_t n_train = all.images.size(0) - o.val_size;
  if (n_train < 1 || o.val_size < 1) {
    throw std::invalid_argument(fmt::format("--val-size {} leaves no training images of the {} loaded", o.val_size,
                                          all.images.size(0)));
  }
  const tk::data::ImageSet train_set = slice(all, 0, n_train);
  const tk::data::ImageSet val_set = slice(all, n_train, o.val_size);
  const tk::data::ImageSet test_set = tk::data::load_mnist_split(o.data_dir, false);
  tk::data::TensorLoader train(train_set.images, train_set.labels,
                               tk::data::TensorLoaderOptions().batch_size(o.batch_size).seed(static_cast<uint64_t>(o.seed)));
  const auto eval_options = tk::data::TensorLoaderOptions().batch_size(1000).shuffle(false);
  tk::data::TensorLoader val(val_set.images, val_set.labels, eval_options);
  tk::data::TensorLoader test(test_set.images, test_set.labels, eval_options);

  // Layer-wise LR decay over the Python model's children (conv1, conv2, head).
  const auto groups = tk::optim::layer_decay_groups(
      model->named_parameters(), tk::optim::child_layer_ids(*model),
      tk::optim::LayerDecayOptions().layer_decay(o.layer_decay).weight_decay(o.weight_decay));
  const auto base = tk::optim::AdamWOptions(o.lr);
  tk::optim::AdamW optimizer(tk::optim::to_param_groups(groups, base), base);
  fmt::print("{:<20} {:>10} {:>8}  {}\n", "group", "peak lr", "decay", "parameters");
  std::vector<double> max_lrs;
  for (const auto& g : groups) {
    max_lrs.push_back(o.lr * g.lr_scale);
    fmt::print("{:<20} {:>10.2e} {:>8g}  {}\n", g.name, max_lrs.back(), g.weight_decay, fmt::join(g.param_names, ", "));
  }

  tk::train::Trainer trainer(model.ptr(), [model](const tk::data::Batch& b) mutable { return model->forward(b.inputs()); },
                             optimizer, tk::train::TrainerOptions().epochs(o.epochs));
  trainer.set_scheduler(std::make_shared<tk::sched::OneCycleLR>(
                            optimizer, tk::sched::OneCycleLROptions(max_lrs).epochs(o.epochs).steps_per_epoch(train.num_batches())),
                        /*per_step=*/true);
  const double before = trainer.evaluate(test).metric("accuracy");
  fmt::print("C++: the Python-pretrained model, test accuracy {:.4f}\n", before);
  trainer.fit(train, &val);
  const double after = trainer.evaluate(test).metric("accuracy");
  fmt::print("C++: fine-tuned {} epochs on {} images, test accuracy {:.4f}\n", o.epochs, n_train, after);
  if (!o.out.empty()) {
    std::filesystem::create_directories(o.out);
    model->eval();
    model->save(o.out + "/finetuned.pt");
    tk::io::save_safetensors(o.out + "/finetuned.safetensors", *model);
    fmt::print("C++: wrote {0}/finetuned.pt and {0}/finetuned.safetensors; in Python:\n"
               "  .venv/bin/python apps/python_interop/evaluate.py --dir {0} --expect {1:.4f}\n",
               o.out, after);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"A TorchScript model pretrained in Python (pretrain.py), fine-tuned here with layer-wise LR "
                         "decay and the Trainer, and written back for Python (evaluate.py)"};
  Options o;
  cli.option("--model", o.model, "TorchScript file (torch.jit.save), e.g. pretrain.py's DIR/pretrained.pt").required();
  cli.option("--data-dir", o.data_dir, "Fashion-MNIST directory").show_default();
  cli.option("--epochs", o.epochs, "Fine-tuning epochs").show_default().range(1, 1000);
  cli.option("--limit-train", o.limit_train, "Use the first N training images (0 = all 60,000)").show_default()
      .non_negative();
  cli.option("--val-size", o.val_size, "Training images held out for validation (from the end)").show_default()
      .positive();
  cli.option("--batch-size", o.batch_size, "Training batch size").show_default().positive();
  cli.option("--lr", o.lr, "Peak LR of the head (OneCycleLR); lower layers get layer_decay^depth of it").show_default()
      .positive();
  cli.option("--layer-decay", o.layer_decay, "LR factor per layer below the head").show_default().range(0.0, 1.0);
  cli.option("--weight-decay", o.weight_decay, "AdamW weight decay (not on biases)").show_default().non_negative();
  cli.option("--seed", o.seed, "Seed of the data order").show_default().non_negative();
  cli.option("--out", o.out, "Directory for finetuned.pt and finetuned.safetensors");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");
  return trainkit::app::run_main([&] { return run(o); });
}
