// Any data, any task: metrics against hand-computed values (and reduced as two ranks would), the Trainer
// and the LR finder over several-input and regression tasks, the torch::data path bitwise equal to the
// TensorLoader path, stop-and-resume per source kind, and clear errors for empty sources.
#include <sstream>

#include <torch/torch.h>

#include "state_compare.h"
#include "support.h"
#include "trainkit/data/device_source.h"
#include "trainkit/data/parallel_loader.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/data/torch_data.h"
#include "trainkit/nn/models.h"
#include "trainkit/sched/plateau.h"
#include "trainkit/train/metric.h"
#include "trainkit/train/trainer.h"
#include "trainkit/tune/lr_finder.h"

using namespace trainkit;
using trainkit::test::WhatContains;

namespace {

struct Pairs : torch::data::datasets::Dataset<Pairs> {
  at::Tensor x, y;
  Pairs(at::Tensor a, at::Tensor b) : x(std::move(a)), y(std::move(b)) {}
  torch::data::Example<> get(size_t i) override { return {x[static_cast<int64_t>(i)], y[static_cast<int64_t>(i)]}; }
  torch::optional<size_t> size() const override { return static_cast<size_t>(x.size(0)); }
};

struct Problem {
  at::Tensor x, y;
  explicit Problem(int64_t n = 96) {
    torch::manual_seed(1234);
    x = torch::randn({n, 16});
    y = x.narrow(1, 0, 3).argmax(1);
  }
};

struct TaskSetup {
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::unique_ptr<train::Trainer> trainer;
  explicit TaskSetup(train::TrainerOptions options) {
    torch::manual_seed(1);
    model = nn::make_mlp(nn::MlpOptions().in_features(16).hidden({32}).dropout(0.2).num_classes(3));
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
    trainer = std::make_unique<train::Trainer>(model, *optimizer, options);
  }
};

class StepCounter : public train::Callback {
 public:
  std::vector<train::StepEvent> steps;
  bool on_step_end(train::Trainer&, const train::StepEvent& e) override {
    steps.push_back(e);
    return false;
  }
};

}  // namespace

TEST_CASE("metrics equal hand-computed values", "[train][metric]") {
  const at::Tensor out = torch::tensor({{0.1, 0.7, 0.2}, {0.5, 0.1, 0.4}, {0.2, 0.3, 0.5}, {0.6, 0.3, 0.1}});
  const at::Tensor target = torch::tensor({1, 2, 2, 1});
  const data::Batch b(torch::zeros({4, 1}), target);
  SECTION("accuracy and top-k, over two updates") {
    auto acc = train::accuracy();
    auto top2 = train::top_k_accuracy(2);
    acc->update(out, b);
    top2->update(out, b);
    CHECK(acc->compute() == 0.5);   // rows 0 and 2
    CHECK(top2->compute() == 1.0);  // row 1: 2 is second; row 3: 1 is second
    acc->update(out.narrow(0, 0, 1), data::Batch(torch::zeros({1, 1}), torch::tensor({0})));
    CHECK(acc->compute() == 0.4);  // 2 of 5
    CHECK(top2->name() == "top2_accuracy");
    acc->reset();
    CHECK(acc->compute() == 0.0);
  }
  SECTION("mean absolute and squared error") {
    const at::Tensor pred = torch::tensor({1.0, 2.0, 4.0});
    const data::Batch r(torch::zeros({3, 1}), torch::tensor({1.5, 2.0, 2.0}).reshape({3, 1}));
    auto mae = train::mean_absolute_error();
    auto mse = train::mean_squared_error();
    mae->update(pred, r);
    mse->update(pred, r);
    CHECK(mae->compute() == Approx((0.5 + 0.0 + 2.0) / 3));
    CHECK(mse->compute() == Approx((0.25 + 0.0 + 4.0) / 3));
  }
  SECTION("state: summing two ranks' states gives the whole set's value") {
    auto a = train::accuracy();
    auto b2 = train::accuracy();
    auto whole = train::accuracy();
    a->update(out.narrow(0, 0, 3), data::Batch(torch::zeros({3}), target.narrow(0, 0, 3)));
    b2->update(out.narrow(0, 3, 1), data::Batch(torch::zeros({1}), target.narrow(0, 3, 1)));
    whole->update(out, b);
    a->set_state(a->state() + b2->state());
    CHECK(a->compute() == whole->compute());
  }
  SECTION("by name, and clear errors") {
    CHECK(train::make_metric("top5_accuracy")->name() == "top5_accuracy");
    CHECK(train::make_metric("mse")->name() == "mse");
    CHECK_THROWS_MATCHES(train::make_metric("f1"), std::invalid_argument, WhatContains("unknown metric \"f1\""));
    auto acc = train::accuracy();
    CHECK_THROWS_MATCHES(acc->update(torch::zeros({4}), b), std::invalid_argument,
                         WhatContains("accuracy: needs an output [B, C, ...] of class scores"));
    CHECK_THROWS_MATCHES(train::top_k_accuracy(4)->update(out, b), std::invalid_argument,
                         WhatContains("k = 4 but the output has 3 classes"));
  }
}

TEST_CASE("evaluate reduces loss and metrics through the reducer as ranks would", "[train][metric][trainer]") {
  const Problem p(60);
  TaskSetup s{train::TrainerOptions()};
  s.trainer->set_metrics({train::accuracy(), train::top_k_accuracy(2)});
  data::TensorLoader whole(p.x, p.y, data::TensorLoaderOptions().batch_size(16).shuffle(false));
  data::TensorLoader rank0(p.x, p.y, data::TensorLoaderOptions().batch_size(16).shuffle(false).num_replicas(2).rank(0));
  data::TensorLoader rank1(p.x, p.y, data::TensorLoaderOptions().batch_size(16).shuffle(false).num_replicas(2).rank(1));
  const train::EvalResult expected = s.trainer->evaluate(whole);
  at::Tensor other;
  s.trainer->set_metric_reducer([&other](at::Tensor& t) { other = t.clone(); });  // rank 1's contribution
  (void)s.trainer->evaluate(rank1);
  s.trainer->set_metric_reducer([&other](at::Tensor& t) { t += other; });  // the all-reduce's sum on rank 0
  const train::EvalResult reduced = s.trainer->evaluate(rank0);
  CHECK(reduced.samples == 60);
  CHECK(reduced.loss == Approx(expected.loss).epsilon(1e-6));  // float32 batch means over other batches
  CHECK(reduced.metric("accuracy") == expected.metric("accuracy"));
  CHECK(reduced.metric("top2_accuracy") == expected.metric("top2_accuracy"));
  CHECK_THROWS_MATCHES(reduced.metric("mse"), std::out_of_range,
                       WhatContains("no metric \"mse\" (have: accuracy, top2_accuracy)"));
}

TEST_CASE("label smoothing follows torch's cross_entropy and evaluate reports the eval loss", "[train][task][golden]") {
  const toml::table& g = trainkit::test::golden("train.toml");
  const auto& t = *g["label_smoothing"].as_table();
  std::vector<float> scores;
  t["scores"].as_array()->for_each([&](const auto& v) { scores.push_back(static_cast<float>(v.value_or(0.0))); });
  std::vector<int64_t> target;
  t["target"].as_array()->for_each([&](const auto& v) { target.push_back(v.value_or(int64_t{0})); });
  const at::Tensor out = torch::tensor(scores).reshape({static_cast<int64_t>(target.size()), -1});
  data::Batch batch;
  batch.add_input(out).add_target(torch::tensor(target));
  const auto* smoothing = t["smoothing"].as_array();
  const auto* loss = t["loss"].as_array();
  REQUIRE(smoothing->size() == loss->size());
  for (size_t i = 0; i < smoothing->size(); ++i) {
    const double s = smoothing->get(i)->value_or(0.0);
    INFO("label_smoothing " << s);
    CHECK(train::cross_entropy_loss(s)(out, batch).item<double>() == Approx(loss->get(i)->value_or(0.0)).epsilon(1e-6));
  }
  CHECK_THROWS_MATCHES(train::cross_entropy_loss(1.0), std::invalid_argument,
                       WhatContains("label_smoothing must be in [0, 1), got 1"));

  const Problem p(48);
  TaskSetup setup{train::TrainerOptions()};
  data::TensorLoader val(p.x, p.y, data::TensorLoaderOptions().batch_size(16).shuffle(false));
  setup.trainer->set_loss(train::cross_entropy_loss(0.3));
  setup.trainer->set_metrics({train::accuracy()});
  setup.model->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor logits = setup.model->forward(p.x);
  const double plain = torch::nn::functional::cross_entropy(logits, p.y).item<double>();
  const double smoothed = torch::nn::functional::cross_entropy(
      logits, p.y, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(0.3)).item<double>();
  REQUIRE(std::abs(plain - smoothed) > 1e-3);
  CHECK(setup.trainer->evaluate(val).loss == Approx(smoothed).epsilon(1e-6));  // no eval loss: the training loss
  setup.trainer->set_eval_loss(train::cross_entropy_loss());
  CHECK(setup.trainer->evaluate(val).loss == Approx(plain).epsilon(1e-6));
}

TEST_CASE("a two-input model trains through the Trainer and the LR finder", "[train][task]") {
  torch::manual_seed(3);
  const int64_t n = 64;
  const at::Tensor a = torch::randn({n, 4});
  const at::Tensor b = torch::randn({n, 4});
  const at::Tensor y = (a.sum(1) > b.sum(1)).to(torch::kLong);
  auto net = torch::nn::Linear(8, 2);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.5));
  auto source = data::FunctionSource(
      [&](int64_t, int64_t index) -> std::optional<data::Batch> {
        if (index * 16 >= n) {
          return std::nullopt;
        }
        data::Batch batch;
        batch.add_input(a.narrow(0, index * 16, 16), "a").add_input(b.narrow(0, index * 16, 16), "b");
        batch.add_target(y.narrow(0, index * 16, 16));
        return batch;
      },
      4);
  const train::ForwardFn forward = [net](const data::Batch& batch) mutable {
    return net->forward(torch::cat({batch.input("a"), batch.input("b")}, 1));
  };
  tune::LRFinder finder(net.ptr(), forward, opt);
  const auto curve = finder.range_test(source, nullptr, tune::LRFinderOptions().num_iter(10).end_lr(1.0));
  CHECK(curve.lrs.size() == 10);  // 4 batches per epoch: the test ran into epochs 1 and 2
  train::Trainer trainer(net.ptr(), forward, opt, train::TrainerOptions().epochs(30));
  const double before = trainer.evaluate(source).loss;
  trainer.fit(source, &source);
  const auto r = trainer.evaluate(source);
  CHECK(r.loss < before);
  CHECK(r.metric("accuracy") > 0.9);
}

TEST_CASE("a regression model trains with an MSE loss and metrics", "[train][task]") {
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({80, 3});
  const at::Tensor y = x.matmul(torch::tensor({1.5, -2.0, 0.5})) + 0.3;  // 1-D targets
  auto net = torch::nn::Linear(3, 1);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(0.05));
  data::TensorLoader train_set(x, y, data::TensorLoaderOptions().batch_size(16).seed(1));
  data::TensorLoader val(x, y, data::TensorLoaderOptions().batch_size(40).shuffle(false));
  tune::LRFinder finder(net, opt, train::mse_loss());
  const auto curve = finder.range_test(train_set, &val, tune::LRFinderOptions().num_iter(12).end_lr(1.0));
  CHECK(curve.lrs.size() >= 2);

  train::Trainer trainer(net, opt, train::TrainerOptions().epochs(40));
  trainer.set_loss(train::mse_loss());
  CHECK(trainer.metrics().empty());  // a task with its own loss drops the accuracy default
  trainer.set_metrics({train::mean_squared_error(), train::mean_absolute_error()});
  trainer.fit(train_set, &val);
  const auto r = trainer.evaluate(val);
  torch::NoGradGuard no_grad;
  const at::Tensor pred = net->forward(x).reshape({-1});
  CHECK(r.metric("mse") == Approx((pred - y).square().mean().item<double>()).epsilon(1e-5));
  CHECK(r.metric("mae") == Approx((pred - y).abs().mean().item<double>()).epsilon(1e-5));
  CHECK(r.metric("mse") == Approx(r.loss).epsilon(1e-5));  // the loss is the same mean here
  CHECK(r.metric("mse") < 0.01);
}

TEST_CASE("ReduceLROnPlateau can monitor any validation metric", "[train][task]") {
  const Problem p;
  TaskSetup s(train::TrainerOptions().epochs(3));
  data::TensorLoader loader(p.x, p.y, data::TensorLoaderOptions().batch_size(8).seed(0));
  data::TensorLoader val(p.x, p.y, data::TensorLoaderOptions().batch_size(48).shuffle(false));
  auto plateau = std::make_shared<sched::ReduceLROnPlateau>(*s.optimizer, sched::ReduceLROnPlateauOptions().mode("max"));
  s.trainer->set_scheduler(plateau, false, "val/top3_accuracy");
  CHECK_THROWS_MATCHES(s.trainer->fit(loader, &val), std::invalid_argument,
                       WhatContains("monitors \"val/top3_accuracy\", which epoch 0 did not measure"));
  TaskSetup t(train::TrainerOptions().epochs(3));
  auto plateau2 = std::make_shared<sched::ReduceLROnPlateau>(*t.optimizer, sched::ReduceLROnPlateauOptions().mode("max"));
  t.trainer->set_scheduler(plateau2, false, "val/accuracy");
  t.trainer->fit(loader, &val);
  CHECK(t.trainer->state().epoch == 3);
}

TEST_CASE("training over a torch::data loader is bitwise the TensorLoader training", "[train][task][torch_data]") {
  const Problem p;
  TaskSetup reference(train::TrainerOptions().epochs(3));
  data::TensorLoader loader(p.x, p.y, data::TensorLoaderOptions().batch_size(8).seed(5));
  reference.trainer->fit(loader);
  for (const size_t workers : {size_t{0}, size_t{2}}) {
    DYNAMIC_SECTION("workers " << workers) {
      auto torch_loader = torch::data::make_data_loader(Pairs(p.x, p.y).map(torch::data::transforms::Stack<>()),
                                                        torch::data::samplers::RandomSampler(96),
                                                        torch::data::DataLoaderOptions().batch_size(8).workers(workers));
      auto source = data::from_torch_data(*torch_loader, data::TorchDataOptions().seed(5));  // length unknown
      TaskSetup other(train::TrainerOptions().epochs(3));
      other.trainer->fit(source);
      CHECK(other.trainer->state().step == 36);
      trainkit::test::require_bitwise_equal_modules(*reference.model, *other.model);
      trainkit::test::require_bitwise_equal_adam(*reference.optimizer, *reference.model, *other.optimizer,
                                                 *other.model);
    }
  }
}

TEST_CASE("a source of unknown length: the epoch's last, shorter accumulation window still steps",
          "[train][task][accumulation]") {
  const Problem p(80);  // 10 batches of 8, windows of 4: 4 + 4 + 2
  TaskSetup s(train::TrainerOptions().epochs(2).accumulation_steps(4));
  data::TensorLoader loader(p.x, p.y, data::TensorLoaderOptions().batch_size(8).seed(2));
  data::FunctionSource unknown([&loader](int64_t epoch, int64_t index) -> std::optional<data::Batch> {
    if (index == 0) {
      loader.set_epoch(epoch);
    }
    return loader.next();
  });
  auto counter = std::make_shared<StepCounter>();
  s.trainer->add_callback(counter);
  s.trainer->fit(unknown);
  REQUIRE(counter->steps.size() == 6);
  CHECK(counter->steps[2].samples == 16);
  CHECK(counter->steps[2].last_of_epoch);
  CHECK(counter->steps[2].num_batches == data::BatchSource::kUnknownLength);
  CHECK_FALSE(counter->steps[1].last_of_epoch);
}

TEST_CASE("stop and resume is bitwise for each kind of source", "[train][task][resume]") {
  const Problem p;
  auto torch_loader = torch::data::make_data_loader(Pairs(p.x, p.y).map(torch::data::transforms::Stack<>()),
                                                    torch::data::samplers::RandomSampler(96),
                                                    torch::data::DataLoaderOptions().batch_size(8));
  auto torch_source = data::from_torch_data(*torch_loader, data::TorchDataOptions().seed(9));
  data::TensorLoader inner(p.x, p.y, data::TensorLoaderOptions().batch_size(8).seed(9));
  data::FunctionSource function_source([&inner](int64_t epoch, int64_t index) -> std::optional<data::Batch> {
    inner.set_epoch(epoch);
    if (index >= inner.num_batches()) {
      return std::nullopt;
    }
    return inner.batch(index);
  });
  const at::Tensor px = p.x;
  const at::Tensor py = p.y;
  data::ParallelLoader parallel(
      96,
      [px, py](int64_t i, at::Generator& gen) {  // per-sample noise from the sample's seeded generator
        return data::Batch(px[i] + 0.1 * torch::randn({16}, gen), py[i]);
      },
      data::ParallelLoaderOptions().batch_size(8).seed(9).num_workers(2));
  auto augmented_inner = std::make_shared<data::TensorLoader>(p.x, p.y, data::TensorLoaderOptions().batch_size(8).seed(9));
  data::DeviceSource augmented(augmented_inner, torch::kCPU,
                               data::DeviceTransformOptions().seed(3).transform([](data::Batch b, at::Generator& gen) {
                                 const at::Tensor x = b.input();
                                 return data::Batch(x + 0.1 * torch::randn(x.sizes(), gen), b.target());
                               }));
  const std::vector<std::pair<std::string, data::BatchSource*>> kinds = {{"torch::data", &torch_source},
                                                                          {"function", &function_source},
                                                                          {"parallel, 2 workers", &parallel},
                                                                          {"device transform", &augmented}};
  for (const auto& [name, source] : kinds) {
    DYNAMIC_SECTION(name) {
      TaskSetup straight(train::TrainerOptions().epochs(2));
      straight.trainer->fit(*source);
      std::stringstream saved;
      {
        TaskSetup first(train::TrainerOptions().epochs(2).max_steps(17));
        first.trainer->fit(*source);
        torch::serialize::OutputArchive out;
        first.trainer->save(out);
        out.save_to(saved);
      }
      TaskSetup second(train::TrainerOptions().epochs(2));
      torch::serialize::InputArchive in;
      in.load_from(saved);
      second.trainer->load(in);
      second.trainer->fit(*source);
      CHECK(second.trainer->state().step == 24);
      trainkit::test::require_bitwise_equal_modules(*straight.model, *second.model);
      trainkit::test::require_bitwise_equal_adam(*straight.optimizer, *straight.model, *second.optimizer,
                                                 *second.model);
    }
  }
}

TEST_CASE("empty sources and bad metric sets give clear errors", "[train][task]") {
  TaskSetup s{train::TrainerOptions()};
  auto empty = data::from_batches({});
  CHECK_THROWS_MATCHES(s.trainer->fit(empty), std::invalid_argument,
                       WhatContains("the training source yielded no batch in epoch 0"));
  CHECK_THROWS_MATCHES(s.trainer->evaluate(empty), std::invalid_argument,
                       WhatContains("the evaluation source yielded no batch"));
  tune::LRFinder finder(s.model, *s.optimizer);
  CHECK_THROWS_MATCHES(finder.range_test(empty), std::invalid_argument,
                       WhatContains("the training source yielded no batch"));
  CHECK_THROWS_MATCHES(s.trainer->set_metrics({train::accuracy(), train::accuracy()}), std::invalid_argument,
                       WhatContains("two metrics named \"accuracy\""));
}
