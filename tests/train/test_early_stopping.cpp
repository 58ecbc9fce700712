// EarlyStopping and ModelCheckpoint decisions on scripted metric sequences, and the model summary. PyTorch
// Lightning is not installed: the expected sequences below were written by hand from its documented semantics
// (EarlyStopping: improvement is monitor_op(current - min_delta·sign, best) with monitor_op < for "min" and
// > for "max", wait resets on improvement, stop when wait >= patience, check_finite / stopping_threshold /
// divergence_threshold stop at once; ModelCheckpoint: save while fewer than k are kept or k == -1, else
// only when strictly better than the k-th best, which is deleted; NaN kept as the worst value).
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <torch/torch.h>

#include "support.h"
#include "trainkit/nn/models.h"
#include "trainkit/train/callbacks/early_stopping.h"
#include "trainkit/train/callbacks/model_checkpoint.h"
#include "trainkit/train/summary.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;

namespace {

const double kNanLoss = std::numeric_limits<double>::quiet_NaN();

/// Feeds `values`; returns the wait count after each, and the index where it stopped (-1 = never).
std::pair<std::vector<int64_t>, int64_t> run(train::EarlyStopping& es, const std::vector<double>& values) {
  std::vector<int64_t> waits;
  for (size_t i = 0; i < values.size(); ++i) {
    const bool stop = es.check(values[i]);
    waits.push_back(es.wait_count());
    if (stop) {
      return {waits, static_cast<int64_t>(i)};
    }
  }
  return {waits, -1};
}

}  // namespace

TEST_CASE("EarlyStopping follows Lightning's rules", "[train][early_stopping]") {
  SECTION("min with min_delta: improvement must beat best - min_delta") {
    train::EarlyStopping es(train::EarlyStoppingOptions().patience(3).min_delta(0.1));
    const auto [waits, stop] = run(es, {1.0, 0.95, 0.85, 0.9, 0.86, 0.84, 0.7});
    CHECK(waits == std::vector<int64_t>{0, 1, 0, 1, 2, 3});
    CHECK(stop == 5);
    CHECK(es.best_score() == 0.85);
  }
  SECTION("max: equal is no improvement") {
    train::EarlyStopping es(train::EarlyStoppingOptions("val/accuracy").mode("max").patience(2));
    const auto [waits, stop] = run(es, {0.5, 0.6, 0.6, 0.55, 0.7});
    CHECK(waits == std::vector<int64_t>{0, 0, 1, 2});
    CHECK(stop == 3);
    CHECK(es.best_score() == 0.6);
  }
  SECTION("patience 0 stops at the first epoch without improvement") {
    train::EarlyStopping es(train::EarlyStoppingOptions().patience(0));
    CHECK(run(es, {1.0, 1.0}).second == 1);
  }
  SECTION("check_finite") {
    train::EarlyStopping es(train::EarlyStoppingOptions().patience(5));
    CHECK(run(es, {1.0, kNanLoss}).second == 1);
    CHECK_THAT(es.stop_reason(), Catch::Matchers::Contains("not finite"));
    train::EarlyStopping lax(train::EarlyStoppingOptions().patience(5).check_finite(false));
    const auto [waits, stop] = run(lax, {1.0, kNanLoss, 0.5});
    CHECK(waits == std::vector<int64_t>{0, 1, 0});
    CHECK(stop == -1);
  }
  SECTION("stopping and divergence thresholds") {
    train::EarlyStopping good(train::EarlyStoppingOptions().patience(5).stopping_threshold(0.5));
    CHECK(run(good, {0.8, 0.6, 0.5, 0.49}).second == 3);  // strictly better than the threshold
    train::EarlyStopping bad(train::EarlyStoppingOptions().patience(5).divergence_threshold(2.0));
    CHECK(run(bad, {1.0, 2.0, 2.5}).second == 2);  // strictly worse than the threshold
    train::EarlyStopping bad_max(train::EarlyStoppingOptions().mode("max").patience(5).divergence_threshold(0.1));
    CHECK(run(bad_max, {0.5, 0.1, 0.05}).second == 2);
  }
  SECTION("state round trip") {
    train::EarlyStopping a(train::EarlyStoppingOptions().patience(3));
    run(a, {1.0, 0.5, 0.7, 0.8});
    torch::serialize::OutputArchive out;
    a.save(out);
    std::stringstream bytes;
    out.save_to(bytes);
    train::EarlyStopping b(train::EarlyStoppingOptions().patience(3));
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    b.load(in);
    CHECK(b.best_score() == 0.5);
    CHECK(b.wait_count() == 2);
    CHECK(b.check(0.9));  // the third epoch without improvement, counted across the resume
  }
  SECTION("invalid options are rejected with the value") {
    CHECK_THROWS_WITH(train::EarlyStopping(train::EarlyStoppingOptions().mode("median")),
                      Catch::Matchers::Contains("median"));
    CHECK_THROWS_WITH(train::EarlyStopping(train::EarlyStoppingOptions().patience(-1)),
                      Catch::Matchers::Contains("-1"));
  }
}

TEST_CASE("ModelCheckpoint keeps the top k as Lightning does", "[train][model_checkpoint]") {
  using Saved = std::pair<bool, std::string>;
  SECTION("min, k = 2; ties do not replace") {
    train::ModelCheckpoint mc(train::ModelCheckpointOptions("unused").save_top_k(2));
    const std::vector<double> scores{0.5, 0.4, 0.45, 0.6, 0.3, 0.4};
    const std::vector<Saved> want{{true, ""}, {true, ""}, {true, "e0"}, {false, ""}, {true, "e2"}, {false, ""}};
    for (size_t i = 0; i < scores.size(); ++i) {
      INFO("epoch " << i);
      CHECK(mc.update(fmt::format("e{}", i), scores[i]) == want[i]);
    }
    CHECK(mc.best_k_models() == std::vector<std::pair<std::string, double>>{{"e1", 0.4}, {"e4", 0.3}});
    CHECK(mc.best_model_path() == "e4");
    CHECK(mc.best_model_score() == 0.3);
  }
  SECTION("max, k = 1, NaN kept as the worst value") {
    train::ModelCheckpoint mc(train::ModelCheckpointOptions("unused").mode("max").save_top_k(1));
    CHECK(mc.update("e0", kNanLoss) == Saved{true, ""});
    CHECK(mc.best_model_score() == -std::numeric_limits<double>::infinity());
    CHECK(mc.update("e1", 0.1) == Saved{true, "e0"});
    CHECK(mc.update("e2", 0.1) == Saved{false, ""});
    CHECK(mc.update("e3", 0.2) == Saved{true, "e1"});
  }
  SECTION("k = -1 keeps all, k = 0 none") {
    train::ModelCheckpoint all(train::ModelCheckpointOptions("unused").save_top_k(-1));
    for (int i = 0; i < 4; ++i) {
      CHECK(all.update(fmt::format("e{}", i), 1.0 + i) == Saved{true, ""});
    }
    train::ModelCheckpoint none(train::ModelCheckpointOptions("unused").save_top_k(0));
    CHECK(none.update("e0", 1.0) == Saved{false, ""});
  }
}

TEST_CASE("ModelCheckpoint writes weight files that torch::load reads, and deletes dropped ones",
          "[train][model_checkpoint]") {
  trainkit::test::TempDir dir("mc");
  torch::manual_seed(0);
  auto model = nn::make_mlp(nn::MlpOptions().in_features(4).hidden({8}).num_classes(2));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  train::Trainer trainer(model, opt);
  train::ModelCheckpoint mc(train::ModelCheckpointOptions(dir.path().string()).save_top_k(1).save_last(true));
  const auto event = [](int64_t epoch, double loss) {
    train::EpochEvent e{epoch, 10 * (epoch + 1), 0.0, std::nullopt, {}, {}};
    e.metrics.set("val/loss", loss);
    return e;
  };
  mc.on_validation_point(trainer, event(0, 0.5));
  CHECK(std::filesystem::exists(dir.path() / "epoch=0-step=10.pt"));
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) {
      p.add_(1.0);
    }
  }
  mc.on_validation_point(trainer, event(1, 0.4));
  CHECK_FALSE(std::filesystem::exists(dir.path() / "epoch=0-step=10.pt"));
  REQUIRE(std::filesystem::exists(dir.path() / "epoch=1-step=20.pt"));
  CHECK(std::filesystem::exists(dir.path() / "last.pt"));
  auto copy = nn::make_mlp(nn::MlpOptions().in_features(4).hidden({8}).num_classes(2));
  torch::load(copy, (dir.path() / "epoch=1-step=20.pt").string());
  const auto a = model->parameters();
  const auto b = copy->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(torch::equal(a[i], b[i]));
  }
  const auto missing = [&] {
    train::EpochEvent e{2, 30, 0.0, std::nullopt, {}, {}};
    e.metrics.set("train/loss", 1.0);
    mc.on_validation_point(trainer, e);
  };
  CHECK_THROWS_WITH(missing(), Catch::Matchers::Contains("val/loss") && Catch::Matchers::Contains("train/loss"));
}

TEST_CASE("summary lists layers, output shapes, parameter counts and sizes", "[train][summary]") {
  torch::nn::Sequential model(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4), torch::nn::ReLU(),
                              torch::nn::Linear(4, 2));
  model[3]->as<torch::nn::Linear>()->bias.set_requires_grad(false);
  model->train();
  const train::ModelSummary s = train::summary(model, torch::zeros({5, 3}));
  CHECK(model->is_training());
  REQUIRE(s.layers.size() == 4);
  CHECK(s.layers[0].output_shape == std::vector<int64_t>{5, 4});
  CHECK(s.layers[3].output_shape == std::vector<int64_t>{5, 2});
  CHECK(s.layers[0].params == 16);
  CHECK(s.layers[1].params == 8);
  CHECK(s.layers[2].params == 0);
  CHECK(s.layers[3].params == 10);
  CHECK(s.params == 34);
  CHECK(s.trainable_params == 32);
  CHECK(s.param_bytes == 34 * 4);
  CHECK(s.buffer_bytes == 4 * 4 + 4 * 4 + 8);  // running mean, var (float) and num_batches_tracked (int64)
  const std::string text = s.to_string();
  CHECK_THAT(text, Catch::Matchers::Contains("[5, 2]") && Catch::Matchers::Contains("32 trainable"));
}

TEST_CASE("Trainer::last_grad_norm is the norm clip_grad_norm_ returned", "[train][monitors]") {
  torch::manual_seed(0);
  auto model = nn::make_mlp(nn::MlpOptions().in_features(4).hidden({8}).num_classes(2).dropout(0.0));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  const at::Tensor x = torch::randn({6, 4});
  const at::Tensor y = torch::tensor({0, 1, 0, 1, 1, 0}, torch::kLong);
  {
    train::Trainer plain(model, opt);
    plain.train_step(data::Batch(x, y));
    CHECK_FALSE(plain.last_grad_norm().defined());  // no clipping, no norm
  }
  // The reference: the same gradients, their norm computed by LibTorch.
  auto copy = nn::make_mlp(nn::MlpOptions().in_features(4).hidden({8}).num_classes(2).dropout(0.0));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < copy->parameters().size(); ++i) {
      copy->parameters()[i].copy_(model->parameters()[i]);
    }
  }
  torch::nn::functional::cross_entropy(copy->forward(x), y).backward();
  const double want = torch::nn::utils::clip_grad_norm_(copy->parameters(), 1e9);
  train::Trainer clipped(model, opt, train::TrainerOptions().clip_grad_norm(1e-3));
  clipped.train_step(data::Batch(x, y));
  REQUIRE(clipped.last_grad_norm().defined());
  CHECK(clipped.last_grad_norm().item<double>() == Approx(want).epsilon(1e-6));
}
