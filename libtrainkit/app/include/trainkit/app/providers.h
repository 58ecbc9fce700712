#pragma once
/// @file
/// What build_run trains on: a data provider (the samples, as batch sources on the run's device) and a
/// model provider (a module, its forward and loss), chosen by `data.dataset` and `model.name` from a
/// Catalog. The built-in image sets and models are one provider each; a program adds its own, with their
/// config keys, and then trains through the same Config, build_run and jobs as `trainkit train`:
///
///   auto catalog = app::Catalog::builtin().add(std::make_shared<MyData>()).add(std::make_shared<MyModels>());
///   app::TrainJobOptions job{"my.toml", {}, "runs/mine", "", catalog};
///   app::run_train_job(job);  // config.toml, metrics, checkpoints, resume, summary.json as for images
///
/// apps/text_classification is the worked example (texts and an LSTM).

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include "trainkit/app/config.h"
#include "trainkit/data/batch_source.h"
#include "trainkit/data/device_source.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/parallel_loader.h"
#include "trainkit/nn/models.h"
#include "trainkit/nn/resnet.h"
#include "trainkit/options.h"
#include "trainkit/train/task.h"

namespace trainkit::app {

/// What the data tell the model provider.
struct DataInfo {
  int64_t classes = 0;                ///< classes of a classification task (0 = not one)
  std::vector<int64_t> sample_shape;  ///< one input's shape ({1, 28, 28}); empty when inputs vary in length
  int64_t vocab_size = 0;             ///< token inputs: the vocabulary's size (0 = not tokens)
  int64_t pad_index = -1;             ///< token inputs: the padding id
};

/// A run's data, as a DataProvider loads it.
struct RunData {
  std::unique_ptr<data::BatchSource> train;  ///< this rank's shard of the training split, batches on the device
  /// Validation batches, null without a validation split. Under DDP each rank holds its part (uneven
  /// shards, every sample once) and the Trainer's metric reducer sums the evaluation over the ranks.
  std::unique_ptr<data::BatchSource> val;
  std::unique_ptr<data::BatchSource> test;  ///< test batches (never null), split over the ranks like `val`
  int64_t train_examples = 0;               ///< whole training split (all ranks)
  int64_t val_examples = 0;
  int64_t test_examples = 0;
  DataInfo info;
  /// The samples, on the host, when the provider holds them as tensors (the image sets; the batch-size
  /// finder slices them); undefined tensors otherwise.
  data::ImageSet train_split;
  data::ImageSet val_split;
  data::ImageSet test_split;
};

/// Where a DataProvider loads to.
struct DataRequest {
  const Config& config;     ///< `[data]` and the provider's own keys (read_extra)
  const std::string& source;  ///< the config file, for errors
  torch::Device device;     ///< batches go there
  int64_t rank = 0;         ///< this process's shard of the training split
  int64_t world_size = 1;
};

/// Loads the data sets named by `data.dataset`.
class DataProvider {
 public:
  virtual ~DataProvider() = default;
  /// The `data.dataset` values it loads.
  virtual std::vector<std::string> datasets() const = 0;
  /// Its own config keys (usually in `[data]`), with their defaults and help.
  virtual std::vector<ConfigKeys> keys() const { return {}; }
  /// The splits of `request.config.data.dataset`; throws ConfigError for settings it cannot honour and
  /// data::DataError for unreadable data, both naming the key or file.
  virtual RunData load(const DataRequest& request) const = 0;
};

/// A model, as a ModelProvider builds it.
struct ModelParts {
  std::shared_ptr<torch::nn::Module> module;
  train::ForwardFn forward;  ///< batch -> output (activation checkpointing, when asked, is in here)
  train::LossFn loss;        ///< null: cross-entropy on the batch's target
  /// Set when `module` is this Sequential and `forward` runs it on the batch's input (with or without
  /// activation checkpointing): `[zero] stage = 3` then gathers its children one at a time
  /// (dist::FullyShardedDataParallel, a unit per child that holds parameters). Null: the model cannot be
  /// fully sharded.
  torch::nn::Sequential sequential{nullptr};
};

/// Builds the models named by `model.name`.
class ModelProvider {
 public:
  virtual ~ModelProvider() = default;
  /// The `model.name` values it builds.
  virtual std::vector<std::string> models() const = 0;
  /// Its own config keys (usually in `[model]`), with their defaults and help.
  virtual std::vector<ConfigKeys> keys() const { return {}; }
  /// `config.model.name` for `data` (on the CPU, weights as the current seed draws them; build_run applies
  /// model.init and moves it). Throws ConfigError naming the key for settings it cannot honour.
  virtual ModelParts build(const Config& config, const DataInfo& data, const std::string& source) const = 0;
};

/// The `[data]` keys of the built-in image sets (fashion-mnist, cifar10), fields of the core options they set.
struct ImageDataOptions {
  /// The training loader: `workers` is its num_workers (0: a TensorLoader in the training thread).
  TORCH_ARG(data::ParallelLoaderOptions, loader);
  /// Keep images as uint8 on the host and normalize each batch on the training device.
  TORCH_ARG(bool, normalize_on_device) = false;
  /// The training batches' augmentation on the device: crop_padding, horizontal_flip, erasing_*.
  TORCH_ARG(data::DeviceTransformOptions, augment);

 public:
  static const OptionBinding<ImageDataOptions>& binding() {
    static const auto b =
        OptionBinding<ImageDataOptions>()
            .include(data::ParallelLoaderOptions::binding(), [](auto& o) -> auto& { return o.loader(); },
                     {"num_workers"}, {{"num_workers", "workers"}})
            .bind(TRAINKIT_OPTION(normalize_on_device), rule::boolean(),
                  "Keep images as uint8 on the host and normalize each batch on the training device (4x fewer "
                  "bytes moved)")
            .include(data::DeviceTransformOptions::binding(), [](auto& o) -> auto& { return o.augment(); },
                     {"crop_padding", "horizontal_flip", "erasing_probability", "erasing_scale", "erasing_ratio",
                      "erasing_value"});
    return b;
  }
};

/// The `[model]` keys of the built-in image models (cnn, mlp, resnet, resnet18), fields of the core options
/// they set; the input's shape and the classes come from the data.
struct ImageModelOptions {
  /// cnn: channels, hidden, dropout, batch_norm; mlp: one hidden layer of `hidden`, `dropout`.
  TORCH_ARG(nn::CnnOptions, cnn);
  /// resnet: depth, zero_init_residual; resnet18: zero_init_residual.
  TORCH_ARG(nn::ResNetOptions, resnet);
  /// The 4-d weights and buffers and each batch's images in channels-last memory format (NHWC).
  TORCH_ARG(bool, channels_last) = false;

 public:
  static const OptionBinding<ImageModelOptions>& binding() {
    static const auto b = OptionBinding<ImageModelOptions>()
                              .include(nn::ResNetOptions::binding(), [](auto& o) -> auto& { return o.resnet(); },
                                       {"depth", "zero_init_residual"})
                              .include(nn::CnnOptions::binding(), [](auto& o) -> auto& { return o.cnn(); },
                                       {"channels", "hidden", "dropout", "batch_norm"})
                              .bind(TRAINKIT_OPTION(channels_last), rule::boolean(),
                                    "Convolution weights and each batch's images in channels-last memory format "
                                    "(NHWC): the same values, often faster convolutions on CPUs (oneDNN) and GPUs "
                                    "(the built-in image models; refused for others)");
    return b;
  }
};

/// The data sets, models and further config sections a program knows.
class Catalog {
 public:
  /// The built-in image sets (fashion-mnist, cifar10; keys: ImageDataOptions) and models (cnn, mlp, resnet,
  /// resnet18; keys: ImageModelOptions; and torchscript: the model.torchscript file).
  static Catalog builtin();
  /// Adds a data provider; its data sets take precedence over those added before under the same name.
  Catalog& add(std::shared_ptr<const DataProvider> provider);
  /// Adds a model provider; its models take precedence over those added before under the same name.
  Catalog& add(std::shared_ptr<const ModelProvider> provider);
  /// Adds config keys of the program's own (e.g. a section that only the program reads).
  Catalog& add(ConfigKeys keys);
  /// The provider of `dataset`; throws ConfigError naming `source` and the known data sets.
  const DataProvider& data(const std::string& dataset, const std::string& source) const;
  /// The provider of `model`; throws ConfigError naming `source` and the known models.
  const ModelProvider& model(const std::string& name, const std::string& source) const;
  /// What the config reader accepts beyond the keys of Config itself: every provider's names and keys.
  ConfigExtensions extensions() const;

 private:
  std::vector<std::pair<std::string, std::shared_ptr<const DataProvider>>> data_;    // by data.dataset name
  std::vector<std::pair<std::string, std::shared_ptr<const ModelProvider>>> models_;  // by model.name name
  std::vector<ConfigKeys> keys_;  // the providers' keys and the program's, in the order they were added
};

}  // namespace trainkit::app
