// Step-based validation (TrainerOptions::val_every_steps, val_fraction: Lightning's val_check_interval):
// validation points fall where the options say (also under accumulation), before the step hooks; early
// stopping, best-k checkpoints and ReduceLROnPlateau follow every point; a run interrupted at or between
// points resumes bitwise.
#include <filesystem>
#include <sstream>

#include <torch/torch.h>

#include "state_compare.h"
#include "support.h"
#include "toy_problem.h"
#include "trainkit/nn/models.h"
#include "trainkit/sched/plateau.h"
#include "trainkit/train/callbacks/early_stopping.h"
#include "trainkit/train/callbacks/model_checkpoint.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;

namespace {

using ValSetup = trainkit::test::ToySetup;

/// Records every validation point and, in one sequence, the order of points and step hooks.
class PointRecorder : public train::Callback {
 public:
  struct Point {
    int64_t step;
    bool epoch_end;
    double val_loss;
    double train_loss;
  };
  std::vector<Point> points;
  std::vector<std::string> order;
  bool on_validation_point(train::Trainer&, const train::EpochEvent& e) override {
    points.push_back({e.step, e.epoch_end, e.val ? e.val->loss : -1.0, e.train_loss});
    order.push_back("val " + std::to_string(e.step));
    return false;
  }
  bool on_step_end(train::Trainer&, const train::StepEvent& e) override {
    order.push_back("step " + std::to_string(e.step));
    return false;
  }
  std::vector<int64_t> steps(bool epoch_end) const {
    std::vector<int64_t> out;
    for (const auto& p : points) {
      if (p.epoch_end == epoch_end) out.push_back(p.step);
    }
    return out;
  }
};

}  // namespace

TEST_CASE("Mid-epoch validation: every N steps over the run, every fraction of an epoch", "[train][trainer][validation]") {
  auto loader = trainkit::test::toy_loader(5);  // 12 batches per epoch
  auto val = trainkit::test::toy_loader(6, 40);
  SECTION("val_every_steps = 5 over 2 epochs") {
    ValSetup s(1, train::TrainerOptions().epochs(2).val_every_steps(5));
    auto rec = std::make_shared<PointRecorder>();
    s.trainer->add_callback(rec);
    s.trainer->fit(loader, &val);
    CHECK(rec->steps(false) == std::vector<int64_t>{5, 10, 15, 20});
    CHECK(rec->steps(true) == std::vector<int64_t>{12, 24});
    // The point comes before the step's hooks (a checkpoint written there holds what it changed).
    const auto at = std::find(rec->order.begin(), rec->order.end(), "val 5");
    REQUIRE(at != rec->order.end());
    CHECK(*(at - 1) == "step 4");
    CHECK(*(at + 1) == "step 5");
    for (const auto& p : rec->points) {
      CHECK(p.val_loss > 0);
      CHECK(p.train_loss > 0);
    }
  }
  SECTION("a multiple of the epoch length validates once at the epoch's end") {
    ValSetup s(1, train::TrainerOptions().epochs(2).val_every_steps(6));
    auto rec = std::make_shared<PointRecorder>();
    s.trainer->add_callback(rec);
    s.trainer->fit(loader, &val);
    CHECK(rec->steps(false) == std::vector<int64_t>{6, 18});
    CHECK(rec->steps(true) == std::vector<int64_t>{12, 24});
  }
  SECTION("val_fraction = 0.5 under 2-batch accumulation: 6 steps per epoch, a point every 3") {
    ValSetup s(1, train::TrainerOptions().epochs(2).val_fraction(0.5).accumulation_steps(2));
    auto rec = std::make_shared<PointRecorder>();
    s.trainer->add_callback(rec);
    s.trainer->fit(loader, &val);
    CHECK(rec->steps(false) == std::vector<int64_t>{3, 9});
    CHECK(rec->steps(true) == std::vector<int64_t>{6, 12});
  }
  SECTION("mid-epoch validation needs a validation source") {
    ValSetup s(1, train::TrainerOptions().val_every_steps(5));
    CHECK_THROWS_WITH(s.trainer->fit(loader), Catch::Matchers::Contains("need a validation source"));
  }
}

TEST_CASE("Early stopping, best-k files and ReduceLROnPlateau follow mid-epoch validations",
          "[train][trainer][validation]") {
  auto loader = trainkit::test::toy_loader(5);
  auto val = trainkit::test::toy_loader(6, 40);
  SECTION("EarlyStopping ends the fit at the second point of epoch 0") {
    trainkit::test::TempDir tmp("val-interval-best");
    // lr 0: the validation loss never improves, so patience 1 stops at the second point (step 8).
    ValSetup s(1, train::TrainerOptions().epochs(3).val_every_steps(4), 0.0);
    s.trainer->add_callback(std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions().patience(1)));
    s.trainer->add_callback(std::make_shared<train::ModelCheckpoint>(
        train::ModelCheckpointOptions(tmp.str("best")).save_top_k(-1)));
    s.trainer->fit(loader, &val);
    CHECK(s.trainer->state().step == 8);
    CHECK(s.trainer->state().epoch == 0);
    CHECK(std::filesystem::exists(tmp.str("best/epoch=0-step=4.pt")));
    CHECK(std::filesystem::exists(tmp.str("best/epoch=0-step=8.pt")));
  }
  SECTION("ReduceLROnPlateau steps at every point") {
    // A negligible LR: the validation loss stays within the threshold, so patience 0 halves the LR at every
    // point after the first: points at steps 4, 8 and the epoch's end 12 → two reductions.
    ValSetup s(1, train::TrainerOptions().epochs(1).val_every_steps(4), 1e-12);
    s.trainer->set_scheduler(std::make_shared<sched::ReduceLROnPlateau>(
                                 *s.optimizer, sched::ReduceLROnPlateauOptions().patience(0).factor(0.5).eps(0)),
                             false);
    s.trainer->fit(loader, &val);
    CHECK(s.optimizer->param_groups()[0].options().get_lr() == Approx(0.25e-12).epsilon(1e-9));
  }
}

TEST_CASE("Mid-epoch validation: a resumed run is bitwise the uninterrupted one", "[train][trainer][validation][resume]") {
  auto loader = trainkit::test::toy_loader(5);
  auto val = trainkit::test::toy_loader(6, 40);
  // ReduceLROnPlateau with patience 0 changes the LR at most points, so a point lost or repeated by the
  // resume changes the weights.
  const auto make = [](uint64_t seed, int64_t max_steps) {
    auto s = std::make_unique<ValSetup>(seed, train::TrainerOptions().epochs(3).val_every_steps(5).max_steps(max_steps));
    s->trainer->set_scheduler(
        std::make_shared<sched::ReduceLROnPlateau>(*s->optimizer, sched::ReduceLROnPlateauOptions().patience(0)), false);
    return s;
  };
  auto straight = make(1, 0);
  auto straight_log = std::make_shared<PointRecorder>();
  straight->trainer->add_callback(straight_log);
  straight->trainer->fit(loader, &val);
  REQUIRE(straight->trainer->state().step == 36);

  for (const int64_t stop : {10, 13}) {  // at a point, between points
    SECTION("interrupted after step " + std::to_string(stop)) {
      std::stringstream saved;
      {
        auto first = make(1, stop);
        first->trainer->fit(loader, &val);
        REQUIRE(first->trainer->state().step == stop);
        torch::serialize::OutputArchive out;
        first->trainer->save(out);
        out.save_to(saved);
      }
      auto second = make(99, 0);
      torch::serialize::InputArchive in;
      in.load_from(saved);
      second->trainer->load(in);
      auto log = std::make_shared<PointRecorder>();
      second->trainer->add_callback(log);
      second->trainer->fit(loader, &val);
      CHECK(second->trainer->state().step == 36);
      trainkit::test::require_bitwise_equal_modules(*straight->model, *second->model);
      // The points after the resume are exactly the uninterrupted run's last ones.
      REQUIRE(log->points.size() < straight_log->points.size());
      const size_t offset = straight_log->points.size() - log->points.size();
      CHECK(log->points.front().step > stop);
      CHECK(straight_log->points[offset - 1].step <= stop);
      for (size_t i = 0; i < log->points.size(); ++i) {
        CHECK(log->points[i].step == straight_log->points[offset + i].step);
        CHECK(log->points[i].val_loss == straight_log->points[offset + i].val_loss);
      }
    }
  }
}
