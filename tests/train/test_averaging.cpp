// EMA (timm ModelEmaV3), AveragedModel, SWALR and update_bn against the same wheel's Python
// (tests/golden/train.toml, float64, the same sequence of model states fed to both), and a Trainer run with
// EMA + SWA + EarlyStopping + ModelCheckpoint resumed mid-way is bitwise equal to an uninterrupted one.
#include <sstream>

#include <torch/torch.h>

#include "state_compare.h"
#include "support.h"
#include "toy_problem.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/nn/models.h"
#include "trainkit/train/callbacks/early_stopping.h"
#include "trainkit/train/callbacks/ema_weight_averaging.h"
#include "trainkit/train/callbacks/model_checkpoint.h"
#include "trainkit/train/callbacks/stochastic_weight_averaging.h"
#include "trainkit/train/ema.h"
#include "trainkit/train/swa.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;

namespace {

torch::nn::Sequential golden_model() {
  torch::nn::Sequential m(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
  // Floating-point tensors only, as Python's .double() (LibTorch's to(kFloat64) would convert
  // num_batches_tracked too).
  for (auto& t : m->parameters()) {
    t.set_data(t.to(torch::kFloat64));
  }
  for (auto& t : m->buffers()) {
    if (t.is_floating_point()) {
      t.set_data(t.to(torch::kFloat64));
    }
  }
  return m;
}

std::vector<double> doubles(const toml::node& node) { return trainkit::test::values_of<double>(node); }

/// The tensors of `m` by state_dict name.
std::map<std::string, at::Tensor> named_state(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) {
    out[p.key()] = p.value();
  }
  for (const auto& b : m.named_buffers()) {
    out[b.key()] = b.value();
  }
  return out;
}

void load_state(torch::nn::Module& m, const toml::table& state) {
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : named_state(m)) {
    const std::vector<double> v = doubles(*state.get(name));
    t.copy_(torch::tensor(v, torch::kFloat64).reshape(t.sizes()));
  }
}

/// The values of `values` (ordered as weight_tensors(m)) by state_dict name.
std::map<std::string, at::Tensor> by_name(torch::nn::Module& m, const std::vector<at::Tensor>& values) {
  std::map<std::string, at::Tensor> out;
  size_t i = 0;
  for (const auto& p : m.named_parameters()) {
    out[p.key()] = values.at(i++);
  }
  for (const auto& b : m.named_buffers()) {
    out[b.key()] = values.at(i++);
  }
  return out;
}

void require_state(torch::nn::Module& m, const std::vector<at::Tensor>& values, const toml::table& want) {
  for (const auto& [name, t] : by_name(m, values)) {
    INFO("tensor " << name << " got " << t << " want " << torch::tensor(doubles(*want.get(name))));
    const at::Tensor expected = torch::tensor(doubles(*want.get(name)), torch::kFloat64).reshape(t.sizes());
    REQUIRE(torch::allclose(t.to(torch::kFloat64), expected, 1e-12, 1e-14));
  }
}

const toml::array& states(const toml::table& g, const std::string& name) { return *g[name].as_array(); }

}  // namespace

TEST_CASE("ScopedWeights swaps averaged weights in for its scope and puts the module's own back bit for bit",
          "[train][ema][swa]") {
  torch::manual_seed(3);
  torch::nn::Sequential m = golden_model();
  const std::vector<at::Tensor> own = [&m] {
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : train::weight_tensors(*m)) {
      out.push_back(t.clone());
    }
    return out;
  }();
  std::vector<at::Tensor> averaged;
  for (const at::Tensor& t : own) {
    averaged.push_back(t.is_floating_point() ? t + 0.25 : t + 1);
  }
  const at::Tensor x = torch::randn({5, 3}, torch::kFloat64);
  m->eval();
  const at::Tensor own_out = m->forward(x);
  {
    train::ScopedWeights scope(*m, averaged);
    const std::vector<at::Tensor> inside = train::weight_tensors(*m);
    for (size_t i = 0; i < inside.size(); ++i) {
      CHECK(torch::equal(inside[i], averaged[i]));
    }
    CHECK_FALSE(torch::equal(m->forward(x), own_out));
  }
  const std::vector<at::Tensor> after = train::weight_tensors(*m);
  REQUIRE(after.size() == own.size());
  for (size_t i = 0; i < after.size(); ++i) {
    CHECK(torch::equal(after[i], own[i]));  // equal() on float64 compares every bit but the NaN payloads
  }
  CHECK(torch::equal(m->forward(x), own_out));
  SECTION("also when the scope is left by an exception") {
    try {
      train::ScopedWeights scope(*m, averaged);
      throw std::runtime_error("evaluation failed");
    } catch (const std::runtime_error&) {
    }
    for (size_t i = 0; i < own.size(); ++i) {
      CHECK(torch::equal(train::weight_tensors(*m)[i], own[i]));
    }
  }
  SECTION("a list of the wrong length is refused before anything changes") {
    std::vector<at::Tensor> short_list(averaged.begin(), averaged.end() - 1);
    CHECK_THROWS_AS(train::ScopedWeights(*m, short_list), std::invalid_argument);
    for (size_t i = 0; i < own.size(); ++i) {
      CHECK(torch::equal(train::weight_tensors(*m)[i], own[i]));
    }
  }
}

TEST_CASE("ModelEma follows timm's ModelEmaV3", "[train][ema][golden]") {
  const toml::table& g = trainkit::test::golden("train.toml");
  for (const std::string c : {"plain", "warmup", "exclude_buffers"}) {
    SECTION(c) {
      const auto& opt = *g["ema_" + c].as_table();
      train::ModelEmaOptions o(opt["decay"].value<double>().value());
      o.min_decay(opt["min_decay"].value_or(0.0))
          .update_after_step(opt["update_after_step"].value_or(int64_t{0}))
          .use_warmup(opt["use_warmup"].value_or(false))
          .warmup_gamma(opt["warmup_gamma"].value_or(1.0))
          .warmup_power(opt["warmup_power"].value_or(2.0 / 3.0))
          .exclude_buffers(opt["exclude_buffers"].value_or(false));
      auto model = golden_model();
      load_state(*model, *states(g, "initial").get(0)->as_table());
      train::ModelEma ema(*model, o);
      const auto decays = doubles(*opt.get("decays"));
      const auto& feed = states(g, "state");
      const auto& after = states(g, "ema_" + c + "_after");
      for (size_t i = 0; i < feed.size(); ++i) {
        INFO("step " << i + 1);
        CHECK(ema.get_decay(static_cast<int64_t>(i + 1)) == Approx(decays[i]).epsilon(1e-15));
        load_state(*model, *feed.get(i)->as_table());
        ema.update(*model, static_cast<int64_t>(i + 1));
        require_state(*model, ema.values(), *after.get(i)->as_table());
      }
    }
  }
}

TEST_CASE("AveragedModel follows torch.optim.swa_utils", "[train][swa][golden]") {
  const toml::table& g = trainkit::test::golden("train.toml");
  for (const std::string c : {"swa", "ema_fn", "use_buffers"}) {
    SECTION(c) {
      auto model = golden_model();
      load_state(*model, *states(g, "initial").get(0)->as_table());
      train::AveragedModel avg(*model, c == "ema_fn" ? train::ema_avg_fn(0.75) : train::AvgFn{}, c == "use_buffers");
      const auto& feed = states(g, "state");
      const auto& after = states(g, "swa_" + c + "_after");
      for (size_t i = 0; i < feed.size(); ++i) {
        INFO("update " << i + 1);
        load_state(*model, *feed.get(i)->as_table());
        avg.update_parameters(*model);
        require_state(*model, avg.values(), *after.get(i)->as_table());
      }
      CHECK(avg.n_averaged() == static_cast<int64_t>(feed.size()));
    }
  }
}

TEST_CASE("SWALR follows torch.optim.swa_utils.SWALR", "[train][swa][golden]") {
  const toml::table& g = trainkit::test::golden("train.toml");
  for (const std::string c : {"cos", "linear", "none"}) {
    SECTION(c) {
      const auto& t = *g["swalr_" + c].as_table();
      auto p0 = torch::zeros({1}, torch::requires_grad());
      auto p1 = torch::zeros({1}, torch::requires_grad());
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(std::vector<at::Tensor>{p0}, std::make_unique<torch::optim::SGDOptions>(0.1));
      groups.emplace_back(std::vector<at::Tensor>{p1}, std::make_unique<torch::optim::SGDOptions>(0.04));
      torch::optim::SGD opt(groups, torch::optim::SGDOptions(0.1));
      train::SWALR sched(opt, train::SWALROptions(0.01)
                                  .anneal_epochs(t["anneal_epochs"].value<int64_t>().value())
                                  .anneal_strategy(t["anneal_strategy"].value<std::string>().value()));
      const auto& lrs = *t["lrs"].as_array();
      for (size_t i = 0; i < lrs.size(); ++i) {
        if (i > 0) {
          sched.step();
        }
        const auto want = doubles(*lrs.get(i));
        INFO("step " << i);
        for (size_t k = 0; k < want.size(); ++k) {
          CHECK(sched.get_last_lr()[k] == Approx(want[k]).epsilon(1e-14));
          CHECK(opt.param_groups()[k].options().get_lr() == Approx(want[k]).epsilon(1e-14));
        }
      }
    }
  }
}

TEST_CASE("update_bn recomputes BatchNorm statistics as torch.optim.swa_utils.update_bn", "[train][swa][golden]") {
  const toml::table& g = trainkit::test::golden("train.toml");
  const auto& t = *g["update_bn"].as_table();
  auto model = golden_model();
  load_state(*model, *states(g, "state").get(0)->as_table());
  std::vector<data::Batch> batches;
  for (const auto& b : *t["batches"].as_array()) {
    const at::Tensor x = torch::tensor(doubles(b), torch::kFloat64).reshape({-1, 3});
    batches.emplace_back(x, torch::zeros({x.size(0)}, torch::kLong));
  }
  auto source = data::from_batches(batches);
  model->eval();
  train::update_bn(*model, [&](const data::Batch& b) { return model->forward(b.input()); }, source);
  CHECK_FALSE(model->is_training());
  auto bn = model[1]->as<torch::nn::BatchNorm1d>();
  CHECK(bn->options.momentum().value() == Approx(t["momentum"].value<double>().value()));
  CHECK(torch::allclose(bn->running_mean, torch::tensor(doubles(*t.get("running_mean")), torch::kFloat64), 1e-12, 1e-14));
  CHECK(torch::allclose(bn->running_var, torch::tensor(doubles(*t.get("running_var")), torch::kFloat64), 1e-12, 1e-14));
  CHECK(bn->num_batches_tracked.item<int64_t>() == t["num_batches_tracked"].value<int64_t>().value());
}

namespace {

struct AvgSetup {
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::unique_ptr<train::Trainer> trainer;
  std::shared_ptr<train::EMAWeightAveraging> ema;
  std::shared_ptr<train::StochasticWeightAveraging> swa;
  std::shared_ptr<train::EarlyStopping> stopping;
  std::shared_ptr<train::ModelCheckpoint> best;
  std::vector<train::EpochEvent> epochs;

  struct Recorder : train::Callback {
    AvgSetup* s;
    explicit Recorder(AvgSetup* setup) : s(setup) {}
    bool on_epoch_end(train::Trainer&, const train::EpochEvent& e) override {
      s->epochs.push_back(e);
      return false;
    }
  };

  AvgSetup(uint64_t init_seed, train::TrainerOptions options, const std::string& dir) {
    torch::manual_seed(init_seed);
    model = nn::make_mlp(nn::MlpOptions().in_features(16).hidden({32}).dropout(0.2).num_classes(3));
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
    trainer = std::make_unique<train::Trainer>(model, *optimizer, options);
    ema = std::make_shared<train::EMAWeightAveraging>(*model, train::ModelEmaOptions(0.9).use_warmup(true));
    swa = std::make_shared<train::StochasticWeightAveraging>(
        *model, *optimizer, train::StochasticWeightAveragingOptions(2e-3).swa_start(1).anneal_epochs(1));
    stopping = std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions("val_ema/loss").patience(10));
    best = std::make_shared<train::ModelCheckpoint>(
        train::ModelCheckpointOptions(dir).monitor("val_ema/accuracy").mode("max").save_top_k(2));
    trainer->add_callback(ema);
    trainer->add_callback(swa);
    trainer->add_callback(stopping);
    trainer->add_callback(best);
    trainer->add_callback(std::make_shared<Recorder>(this));
  }
};

}  // namespace

TEST_CASE("Trainer resume with EMA, SWA, EarlyStopping and ModelCheckpoint is bitwise", "[train][ema][swa][resume]") {
  auto loader = trainkit::test::toy_loader(5);
  auto val = trainkit::test::toy_loader(6, 40);
  const int64_t total_epochs = 4;  // 12 steps per epoch
  trainkit::test::TempDir dir_a("avg-a"), dir_b("avg-b");
  AvgSetup straight(1, train::TrainerOptions().epochs(total_epochs), dir_a.path().string());
  straight.trainer->fit(loader, &val);
  REQUIRE(straight.trainer->state().step == 48);
  REQUIRE(straight.swa->averaged().n_averaged() == 3);

  for (const int64_t stop : {7, 24, 29}) {  // before SWA, at an epoch boundary inside SWA, mid-epoch in SWA
    SECTION("interrupted after step " + std::to_string(stop)) {
      std::stringstream saved;
      {
        AvgSetup first(1, train::TrainerOptions().epochs(total_epochs).max_steps(stop), dir_b.path().string());
        first.trainer->fit(loader, &val);
        torch::serialize::OutputArchive out;
        first.trainer->save(out);
        out.save_to(saved);
        torch::rand({100});
      }
      AvgSetup second(99, train::TrainerOptions().epochs(total_epochs), dir_b.path().string());
      torch::serialize::InputArchive in;
      in.load_from(saved);
      second.trainer->load(in);
      second.trainer->fit(loader, &val);
      REQUIRE(second.trainer->state().step == 48);
      trainkit::test::require_bitwise_equal_modules(*straight.model, *second.model);
      const auto& a = straight.ema->ema().values();
      const auto& b = second.ema->ema().values();
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        REQUIRE(torch::equal(a[i], b[i]));
      }
      CHECK(straight.swa->averaged().n_averaged() == second.swa->averaged().n_averaged());
      for (size_t i = 0; i < a.size(); ++i) {
        REQUIRE(torch::equal(straight.swa->averaged().values()[i], second.swa->averaged().values()[i]));
      }
      CHECK(straight.optimizer->param_groups()[0].options().get_lr() ==
            second.optimizer->param_groups()[0].options().get_lr());
      CHECK(straight.stopping->best_score() == second.stopping->best_score());
      CHECK(straight.stopping->wait_count() == second.stopping->wait_count());
      CHECK(straight.best->best_k_models() == second.best->best_k_models());
      REQUIRE(!second.epochs.empty());
      CHECK(second.epochs.back().metrics.at("val_ema/loss") == straight.epochs.back().metrics.at("val_ema/loss"));
    }
  }
  // SWALR annealed to swa_lr in one epoch and the Trainer's (constant) LR did not come back.
  CHECK(straight.optimizer->param_groups()[0].options().get_lr() == Approx(2e-3));
}
