// A program's own data set and model through the app layer: a data provider and a model provider with
// config keys of their own (in [data] and in a new section) are read, checked, printed and listed like the
// built-in keys, and build_run and the train job use the providers that data.dataset and model.name name.
#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/app/config.h"
#include "trainkit/app/jobs.h"
#include "trainkit/app/providers.h"
#include "trainkit/app/run.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/options.h"

using namespace trainkit;
using trainkit::test::WhatContains;

namespace {

/// The toy data set's own [data] keys.
struct ToyDataOptions {
  TORCH_ARG(int64_t, samples) = 24;
  TORCH_ARG(int64_t, features) = 4;

 public:
  static const OptionBinding<ToyDataOptions>& binding() {
    static const auto b = OptionBinding<ToyDataOptions>()
        .bind(TRAINKIT_OPTION(samples), rule::integer(2), "samples in the data set")
        .bind(TRAINKIT_OPTION(features), rule::integer(1), "features per sample");
    return b;
  }
};

/// "toy": `samples` vectors of `features` numbers, class = the index of the largest of the first three.
class ToyData : public app::DataProvider {
 public:
  std::vector<std::string> datasets() const override { return {"toy"}; }
  std::vector<app::ConfigKeys> keys() const override {
    return {app::ConfigKeys::of("data", ToyDataOptions::binding(), "data.dataset = \"toy\"")};
  }
  app::RunData load(const app::DataRequest& request) const override {
    const auto o = app::read_extra(request.config, "data", ToyDataOptions::binding());
    at::Tensor x = torch::sin(torch::arange(o.samples() * o.features(), torch::kFloat).reshape({o.samples(), o.features()}));
    at::Tensor y = x.narrow(1, 0, std::min<int64_t>(3, o.features())).argmax(1);
    const int64_t n_val = request.config.data.val_size;
    const int64_t n_train = o.samples() - n_val;
    const auto loader = [&](int64_t start, int64_t n, bool train) -> std::unique_ptr<data::BatchSource> {
      return std::make_unique<data::TensorLoader>(
          x.narrow(0, start, n), y.narrow(0, start, n),
          data::TensorLoaderOptions().batch_size(request.config.train.batch_size).shuffle(train));
    };
    app::RunData run;
    run.train = loader(0, n_train, true);
    run.val = n_val > 0 ? loader(n_train, n_val, false) : nullptr;
    run.test = loader(0, o.samples(), false);
    run.train_examples = n_train;
    run.val_examples = n_val;
    run.test_examples = o.samples();
    run.info.classes = 3;
    run.info.sample_shape = {o.features()};
    return run;
  }
};

/// "linear": one Linear layer over DataInfo::sample_shape.
class ToyModels : public app::ModelProvider {
 public:
  std::vector<std::string> models() const override { return {"linear"}; }
  app::ModelParts build(const app::Config&, const app::DataInfo& data, const std::string&) const override {
    torch::nn::Linear linear(data.sample_shape.at(0), data.classes);
    return {linear.ptr(), [linear](const data::Batch& b) mutable { return linear->forward(b.input()); }, nullptr};
  }
};

/// A section of the program's own.
struct ReportOptions {
  TORCH_ARG(std::string, title) = "toy";
 public:
  static const OptionBinding<ReportOptions>& binding() {
    static const auto b = OptionBinding<ReportOptions>().bind(TRAINKIT_OPTION(title), rule::text(), "report title");
    return b;
  }
};

app::Catalog toy_catalog() {
  return app::Catalog::builtin()
      .add(std::make_shared<ToyData>())
      .add(std::make_shared<ToyModels>())
      .add(app::ConfigKeys::of("report", ReportOptions::binding()));
}

const char* const kToyToml =
    "[data]\ndataset = \"toy\"\nsamples = 30\nval_size = 6\n[model]\nname = \"linear\"\n"
    "[train]\nepochs = 2\nbatch_size = 8\n[report]\ntitle = \"mine\"\n";

}  // namespace

TEST_CASE("config: a program's own keys are read, checked, printed and listed", "[app][providers][config]") {
  const app::ConfigExtensions ext = toy_catalog().extensions();
  const app::Config c = app::parse_config(kToyToml, "toy.toml", {"data.features=5"}, ext);
  CHECK(c.data.dataset == "toy");
  CHECK(c.model.name == "linear");
  const auto data = app::read_extra(c, "data", ToyDataOptions::binding());
  CHECK(data.samples() == 30);
  CHECK(data.features() == 5);
  CHECK(app::read_extra(c, "report", ReportOptions::binding()).title() == "mine");

  const std::string toml = app::to_toml(c);
  CHECK_THAT(toml, Catch::Contains("samples = 30"));
  CHECK_THAT(toml, Catch::Contains("[report]\ntitle = \"mine\""));
  const app::Config again = app::parse_config(toml, "effective.toml", {}, ext);
  CHECK(app::to_toml(again) == toml);

  CHECK_THROWS_MATCHES(app::parse_config(kToyToml, "toy.toml", {"data.samples=1"}, ext), app::ConfigError,
                       WhatContains("--set data.samples=1: expected an integer >= 2"));
  CHECK_THROWS_MATCHES(app::parse_config(kToyToml, "toy.toml", {"data.sample=3"}, ext), app::ConfigError,
                       WhatContains("unknown key 'data.sample'"));
  CHECK_THROWS_MATCHES(app::parse_config("[data]\nsampels = 3\n", "toy.toml", {}, ext), app::ConfigError,
                       WhatContains("known keys in [data]: dataset, dir"));
  // Without the program's extensions its names and keys are unknown.
  CHECK_THROWS_MATCHES(app::parse_config(kToyToml, "toy.toml"), app::ConfigError,
                       WhatContains("data.dataset: expected"));
  CHECK_THROWS_MATCHES(app::parse_config("[report]\ntitle = \"x\"\n", "toy.toml"), app::ConfigError,
                       WhatContains("unknown table or key 'report'"));
  // The built-in image sets and models are providers like the toy ones: a catalog without them knows neither
  // their names nor their keys, and their keys are the core options' fields with the core's rules.
  const app::ConfigExtensions toy_only =
      app::Catalog().add(std::make_shared<ToyData>()).add(std::make_shared<ToyModels>()).extensions();
  CHECK_THROWS_MATCHES(app::parse_config("[data]\ndataset = \"fashion-mnist\"\n", "toy.toml", {}, toy_only),
                       app::ConfigError, WhatContains("toy.toml: data.dataset: expected one of \"toy\", got \"fashion-mnist\""));
  CHECK_THROWS_MATCHES(app::parse_config(kToyToml, "toy.toml", {"data.workers=2"}, toy_only), app::ConfigError,
                       WhatContains("unknown key 'data.workers'"));
  CHECK_THROWS_MATCHES(app::parse_config("", "toy.toml", {"model.depth=21"}), app::ConfigError,
                       WhatContains("--set model.depth=21: expected an integer 6n + 2"));
  const app::Config workers = app::parse_config("", "toy.toml", {"data.workers=3", "model.hidden=7"});
  CHECK(app::read_extra(workers, "data", app::ImageDataOptions::binding()).loader().num_workers() == 3);
  CHECK(app::read_extra(workers, "model", app::ImageModelOptions::binding()).cnn().hidden() == 7);

  const std::string keys = app::config_keys_markdown(ext);
  CHECK_THAT(keys, Catch::Contains("| `data.samples` | integer >= 2 | `24` | samples in the data set (when data.dataset = \"toy\") |"));
  CHECK_THAT(keys, Catch::Contains("| `report.title` |"));
  CHECK_THAT(keys, Catch::Contains("| `data.dataset` | \"fashion-mnist\" or \"cifar10\" or \"toy\" |"));
  CHECK_THAT(keys, Catch::Contains(" or \"torchscript\" or \"linear\" |"));
}

TEST_CASE("build_run and the train job use the providers the config names", "[app][providers][run]") {
  const app::Catalog catalog = toy_catalog();
  const app::Config c = app::parse_config(kToyToml, "toy.toml", {}, catalog.extensions());
  app::Run run = app::build_run(c, "toy.toml", {}, catalog);
  CHECK(run.train_examples == 24);  // data.samples = 30 less data.val_size = 6: the provider read its key
  CHECK(run.val_examples == 6);
  CHECK(run.info.sample_shape == std::vector<int64_t>{4});
  CHECK(run.model->parameters().size() == 2);
  CHECK(run.model->parameters()[0].sizes() == at::IntArrayRef({3, 4}));
  CHECK_FALSE(run.train_split.images.defined());  // not held as tensors
  run.trainer->fit(*run.train, run.val.get());
  CHECK(run.trainer->state().step == 6);  // 2 epochs of 3 batches

  SECTION("an image model refuses the toy data, naming both") {
    const app::Config cnn = app::parse_config(kToyToml, "toy.toml", {"model.name=\"cnn\""}, catalog.extensions());
    CHECK_THROWS_MATCHES(app::build_run(cnn, "toy.toml", {}, catalog), app::ConfigError,
                         WhatContains("model.name = \"cnn\" takes images (channels x height x width), but "
                                      "data.dataset = \"toy\" gives inputs of shape [4]"));
  }
  SECTION("the train job writes the run directory with the program's keys") {
    trainkit::test::TempDir tmp("providers");
    std::ofstream(tmp.str("toy.toml")) << kToyToml;
    app::TrainJobOptions job;
    job.config_path = tmp.str("toy.toml");
    job.out_dir = tmp.str("run");
    job.catalog = catalog;
    const app::TrainJobResult result = app::run_train_job(job);
    CHECK(result.steps == 6);
    CHECK(result.finished);
    std::ifstream effective(tmp.str("run/config.toml"));
    const std::string text((std::istreambuf_iterator<char>(effective)), std::istreambuf_iterator<char>());
    CHECK_THAT(text, Catch::Contains("samples = 30"));
    CHECK(std::filesystem::is_regular_file(tmp.str("run/summary.json")));
  }
}
