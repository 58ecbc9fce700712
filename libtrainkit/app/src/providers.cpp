#include "trainkit/app/providers.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "trainkit/data/cifar.h"
#include "trainkit/data/device_source.h"
#include "trainkit/data/parallel_loader.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/data/transforms.h"
#include "trainkit/nn/activation_checkpoint.h"
#include "trainkit/nn/models.h"
#include "trainkit/nn/resnet.h"
#include "trainkit/nn/script_module.h"

namespace trainkit::app {
namespace {

/// What the model and the normalization need to know about data.dataset's images.
struct ImageFormat {
  int64_t channels;
  int64_t size;
  std::vector<double> mean;
  std::vector<double> std;
};

ImageFormat image_format(const std::string& dataset) {
  if (dataset == "cifar10") {
    return {3, 32, {std::begin(data::kCifar10Mean), std::end(data::kCifar10Mean)},
            {std::begin(data::kCifar10Std), std::end(data::kCifar10Std)}};
  }
  return {1, 28, {data::kFashionMnistMean}, {data::kFashionMnistStd}};
}

data::ImageSet slice(const data::ImageSet& s, int64_t start, int64_t len) {
  return {s.images.narrow(0, start, len), s.labels.narrow(0, start, len)};
}


/// fashion-mnist and cifar10. The samples stay on the host (uint8 when normalized on the device); each
/// batch is moved to the training device by a DeviceSource, which also normalizes and augments there when
/// the config asks for it.
class ImageData : public DataProvider {
 public:
  std::vector<std::string> datasets() const override { return {"fashion-mnist", "cifar10"}; }
  std::vector<ConfigKeys> keys() const override {
    return {ConfigKeys::of("data", ImageDataOptions::binding(),
                           fmt::format("data.dataset = \"{}\"", fmt::join(datasets(), "\", \"")))};
  }

  RunData load(const DataRequest& request) const override {
    const Config& config = request.config;
    const std::string& source = request.source;
    const auto o = read_extra(config, "data", ImageDataOptions::binding());
    RunData run;
    const bool on_device = o.normalize_on_device();
    const ImageFormat image = image_format(config.data.dataset);
    run.info.classes = 10;
    run.info.sample_shape = {image.channels, image.size, image.size};
    const auto load = [&](bool train, int64_t limit) {
      if (config.data.dataset == "cifar10") {
        data::ImageSet set = data::load_cifar10_split(config.data.dir, train, limit);
        if (!on_device) {
          set.images = data::normalize(set.images, image.mean, image.std);
        }
        return set;
      }
      return on_device ? data::load_mnist_split_uint8(config.data.dir, train, limit)
                       : data::load_mnist_split(config.data.dir, train, limit, image.mean[0], image.std[0]);
    };
    const data::ImageSet full_train = load(true, config.data.limit_train);
    const int64_t n_all = full_train.images.size(0);
    if (config.data.val_size >= n_all) {
      throw ConfigError(fmt::format("{}: data.val_size ({}) must be smaller than the {} training examples", source,
                                    config.data.val_size, n_all));
    }
    const int64_t n_train = n_all - config.data.val_size;
    run.train_split = slice(full_train, 0, n_train);
    run.val_split = slice(full_train, n_train, config.data.val_size);
    run.test_split = load(false, config.data.limit_test);
    run.train_examples = n_train;
    run.val_examples = config.data.val_size;
    run.test_examples = run.test_split.images.size(0);

    const bool augment =
        o.augment().crop_padding() > 0 || o.augment().horizontal_flip() || o.augment().erasing_probability() > 0;
    const auto to_device = [&](std::shared_ptr<data::BatchSource> host,
                               bool train) -> std::unique_ptr<data::BatchSource> {
      data::DeviceTransformOptions transform = train ? o.augment() : data::DeviceTransformOptions();
      transform.seed(static_cast<uint64_t>(config.train.seed));
      if (on_device) {
        transform.normalize(image.mean, image.std);
      }
      return std::make_unique<data::DeviceSource>(std::move(host), request.device, transform);
    };
    // The training order, the same for either loader.
    const auto sampler = [&](auto options) {
      return options.batch_size(config.train.batch_size)
          .shuffle(true)
          .seed(static_cast<uint64_t>(config.train.seed))
          .num_replicas(request.world_size)
          .rank(request.rank);
    };
    const int64_t workers = o.loader().num_workers();
    std::shared_ptr<data::BatchSource> train;
    if (workers > 0) {
      const data::ImageSet split = run.train_split;
      train = std::make_shared<data::ParallelLoader>(
          n_train, [split](int64_t i, at::Generator&) { return data::Batch(split.images[i], split.labels[i]); },
          sampler(o.loader()).pin_memory(request.device.is_cuda()));
    } else {
      train = std::make_shared<data::TensorLoader>(run.train_split.images, run.train_split.labels,
                                                   sampler(data::TensorLoaderOptions()));
    }
    run.train = to_device(std::move(train), true);
    const auto eval = [&](const data::ImageSet& s) {
      return to_device(std::make_shared<data::TensorLoader>(
                           s.images, s.labels,
                           data::TensorLoaderOptions()
                               .batch_size(config.train.eval_batch_size)
                               .shuffle(false)
                               .num_replicas(request.world_size)  // each rank evaluates its part; sums are reduced
                               .rank(request.rank)
                               .even_shards(false)),
                       false);
    };
    if (config.data.val_size > 0) {
      run.val = eval(run.val_split);
    }
    run.test = eval(run.test_split);
    spdlog::info("data: {} loader{}, batches moved to {}{}{}", workers > 0 ? "parallel" : "tensor",
                 workers > 0 ? fmt::format(" ({} workers)", workers) : "",
                 request.device.str(), on_device ? ", normalized there" : "", augment ? ", augmented there" : "");
    return run;
  }
};

/// `t` in channels-last memory format as Python's `t.to(memory_format=torch.channels_last)`: a copy unless
/// its strides already suggest that format. Not t.contiguous(ChannelsLast): that keeps a 1-channel tensor's
/// NCHW strides (they count as channels-last-contiguous), from which oneDNN and cuDNN pick NCHW kernels.
at::Tensor as_channels_last(const at::Tensor& t) {
  return t.to(t.options(), /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::ChannelsLast);
}

/// model.channels_last: the 4-d parameters and buffers of `model` in channels-last memory format, in place
/// (the values unchanged; initialization and moves to a device keep the format).
void to_channels_last(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (const auto& tensors : {model.parameters(), model.buffers()}) {
    for (at::Tensor t : tensors) {
      if (t.dim() == 4) {
        t.set_data(as_channels_last(t));
      }
    }
  }
}

/// cnn, mlp, resnet and resnet18 over images of DataInfo::sample_shape.
class ImageModels : public ModelProvider {
 public:
  std::vector<std::string> models() const override { return {"cnn", "mlp", "resnet", "resnet18"}; }
  std::vector<ConfigKeys> keys() const override {
    return {ConfigKeys::of("model", ImageModelOptions::binding())};  // each key's help names its models
  }

  ModelParts build(const Config& config, const DataInfo& data, const std::string& source) const override {
    const ModelConfig& m = config.model;
    const auto o = read_extra(config, "model", ImageModelOptions::binding());
    if (data.sample_shape.size() != 3) {
      throw ConfigError(fmt::format("{}: model.name = \"{}\" takes images (channels x height x width), but "
                                    "data.dataset = \"{}\" gives inputs of shape [{}]",
                                    source, m.name, config.data.dataset, fmt::join(data.sample_shape, ", ")));
    }
    const int64_t channels = data.sample_shape[0];
    const int64_t size = data.sample_shape[1];
    const auto resnet = nn::ResNetOptions(o.resnet()).in_channels(channels);
    const nn::CnnOptions& cnn = o.cnn();
    torch::nn::Sequential model =
        m.name == "mlp" ? nn::make_mlp(nn::MlpOptions().in_features(channels * size * size).hidden({cnn.hidden()}).dropout(cnn.dropout()))
        : m.name == "resnet"   ? nn::make_cifar_resnet(resnet)
        : m.name == "resnet18" ? nn::make_resnet18(resnet)
                               : nn::make_cnn(nn::CnnOptions(cnn).in_channels(channels).image_size(size));
    if (m.checkpoint_segments > static_cast<int64_t>(model->size())) {
      throw ConfigError(fmt::format("{}: model.checkpoint_segments ({}) must be at most the model's {} modules",
                                    source, m.checkpoint_segments, model->size()));
    }
    ModelParts parts{model.ptr(), train::forward_first_input(model), nullptr, model};
    const bool channels_last = o.channels_last();
    // The batch's images in the model's memory format.
    const auto images = [channels_last](const data::Batch& batch) {
      return channels_last ? as_channels_last(batch.input()) : batch.input();
    };
    if (channels_last) {
      to_channels_last(*model);
      parts.forward = [model, images](const data::Batch& batch) mutable { return model->forward(images(batch)); };
    }
    if (m.checkpoint_segments > 0) {
      // checkpoint_sequential; a plain forward when grad is disabled, as in evaluation.
      parts.forward = [model, segments = m.checkpoint_segments, images](const data::Batch& batch) {
        return nn::checkpoint_sequential(model, segments, images(batch));
      };
    }
    return parts;
  }
};

/// torchscript: the model.torchscript file, its forward over the batch's inputs in order.
class ScriptModels : public ModelProvider {
 public:
  std::vector<std::string> models() const override { return {"torchscript"}; }

  ModelParts build(const Config& config, const DataInfo&, const std::string& source) const override {
    const ModelConfig& m = config.model;
    if (m.torchscript.empty()) {
      throw ConfigError(fmt::format("{}: model.name = \"torchscript\" needs model.torchscript = \"<file>\" (a "
                                    "torch.jit.save file)",
                                    source));
    }
    if (m.checkpoint_segments > 0) {
      throw ConfigError(fmt::format("{}: model.checkpoint_segments applies to the built-in image models, not to "
                                    "model.name = \"torchscript\"",
                                    source));
    }
    if (read_extra(config, "model", ImageModelOptions::binding()).channels_last()) {
      throw ConfigError(fmt::format("{}: model.channels_last applies to the built-in image models, not to "
                                    "model.name = \"torchscript\" (trainkit would not convert its weights or batches)",
                                    source));
    }
    nn::ScriptModule model(nullptr);
    try {
      model = nn::ScriptModule(nn::ScriptModuleImpl::load(m.torchscript));
    } catch (const std::runtime_error& e) {
      throw ConfigError(fmt::format("{}: model.torchscript: {}", source, e.what()));
    }
    return {model.ptr(), [model](const data::Batch& b) mutable { return model->forward(b.inputs()); }, nullptr};
  }
};

/// Every name in `served`, once each, in the order the providers were added.
template <class Provider>
std::vector<std::string> names_of(const std::vector<std::pair<std::string, Provider>>& served) {
  std::vector<std::string> out;
  for (const auto& entry : served) {
    if (std::find(out.begin(), out.end(), entry.first) == out.end()) {
      out.push_back(entry.first);
    }
  }
  return out;
}

/// The provider serving `name`, the one added last first; null when none does.
template <class Provider>
auto find_provider(const std::vector<std::pair<std::string, Provider>>& served, const std::string& name) {
  const auto it = std::find_if(served.rbegin(), served.rend(), [&](const auto& entry) { return entry.first == name; });
  return it == served.rend() ? nullptr : it->second.get();
}

}  // namespace

ConfigExtensions builtin_extensions() { return Catalog::builtin().extensions(); }

Catalog Catalog::builtin() {
  Catalog c;
  c.add(std::make_shared<ImageData>());
  c.add(std::make_shared<ImageModels>());
  c.add(std::make_shared<ScriptModels>());
  return c;
}

Catalog& Catalog::add(std::shared_ptr<const DataProvider> provider) {
  for (const auto& name : provider->datasets()) {
    data_.emplace_back(name, provider);
  }
  const auto keys = provider->keys();
  keys_.insert(keys_.end(), keys.begin(), keys.end());
  return *this;
}

Catalog& Catalog::add(std::shared_ptr<const ModelProvider> provider) {
  for (const auto& name : provider->models()) {
    models_.emplace_back(name, provider);
  }
  const auto keys = provider->keys();
  keys_.insert(keys_.end(), keys.begin(), keys.end());
  return *this;
}

Catalog& Catalog::add(ConfigKeys keys) {
  keys_.push_back(std::move(keys));
  return *this;
}

const DataProvider& Catalog::data(const std::string& dataset, const std::string& source) const {
  if (const DataProvider* p = find_provider(data_, dataset)) {
    return *p;
  }
  throw ConfigError(fmt::format("{}: data.dataset = \"{}\" is not a data set this program loads (known: {})", source,
                                dataset, fmt::join(names_of(data_), ", ")));
}

const ModelProvider& Catalog::model(const std::string& name, const std::string& source) const {
  if (const ModelProvider* p = find_provider(models_, name)) {
    return *p;
  }
  throw ConfigError(fmt::format("{}: model.name = \"{}\" is not a model this program builds (known: {})", source,
                                name, fmt::join(names_of(models_), ", ")));
}

ConfigExtensions Catalog::extensions() const { return {names_of(data_), names_of(models_), keys_}; }

}  // namespace trainkit::app
