// Trainer: N steps + save + load into fresh objects + M steps is bitwise equal to N+M steps; hooks see
// every step and epoch and can stop training; evaluation reports loss and accuracy; under accumulation only
// the last micro-batch of each window synchronises gradients (no_sync). Checkpoints hold every CUDA
// generator; a checkpoint from a machine with another GPU count loads with one warning.
#include <algorithm>
#include <sstream>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "state_compare.h"
#include "device/testdev.h"
#include "support.h"
#include "toy_problem.h"
#include "trainkit/data/batch_source.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/nn/models.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;
using trainkit::test::LogCapture;

namespace {

using Setup = trainkit::test::ToySetup;

class Recorder : public train::Callback {
 public:
  int64_t stop_at = -1;
  std::vector<int64_t> steps;
  std::vector<train::EpochEvent> epochs;
  bool on_step_end(train::Trainer&, const train::StepEvent& e) override {
    steps.push_back(e.step);
    return e.step == stop_at;
  }
  bool on_epoch_end(train::Trainer&, const train::EpochEvent& e) override {
    epochs.push_back(e);
    return false;
  }
};

}  // namespace

TEST_CASE("Trainer resume is bitwise identical to an uninterrupted run", "[train][trainer][resume]") {
  auto loader = trainkit::test::toy_loader(5);
  auto val = trainkit::test::toy_loader(6, 40);
  const int64_t total_epochs = 3;  // 12 batches per epoch → 36 steps

  Setup straight(1, train::TrainerOptions().epochs(total_epochs));
  auto straight_log = std::make_shared<Recorder>();
  straight.trainer->add_callback(straight_log);
  straight.trainer->fit(loader, &val);
  REQUIRE(straight.trainer->state().step == 36);

  for (const int64_t stop : {7, 12, 29}) {  // mid-epoch, at an epoch boundary, late
    SECTION("interrupted after step " + std::to_string(stop)) {
      std::stringstream saved;
      {
        Setup first(1, train::TrainerOptions().epochs(total_epochs).max_steps(stop));
        first.trainer->fit(loader, &val);
        REQUIRE(first.trainer->state().step == stop);
        torch::serialize::OutputArchive out;
        first.trainer->save(out);
        out.save_to(saved);
        torch::rand({100});  // disturb the global generator: the checkpoint must restore it
      }
      Setup second(99, train::TrainerOptions().epochs(total_epochs));  // different init, overwritten by load
      torch::serialize::InputArchive in;
      in.load_from(saved);
      second.trainer->load(in);
      auto log = std::make_shared<Recorder>();
      second.trainer->add_callback(log);
      second.trainer->fit(loader, &val);

      CHECK(second.trainer->state().step == 36);
      CHECK(log->steps.front() == stop + 1);
      trainkit::test::require_bitwise_equal_modules(*straight.model, *second.model);
      trainkit::test::require_bitwise_equal_adam(*straight.optimizer, *straight.model, *second.optimizer,
                                                 *second.model);
      // the epochs finished after the resume report exactly what the uninterrupted run reported
      REQUIRE(!log->epochs.empty());
      const auto& last = log->epochs.back();
      const auto& expected = straight_log->epochs.back();
      CHECK(last.epoch == expected.epoch);
      CHECK(last.train_loss == expected.train_loss);
      CHECK(last.val->loss == expected.val->loss);
    }
  }
}

namespace {

/// `trainer`'s checkpoint with its CUDA generator entries replaced by `states` (as a GPU machine writes).
std::string checkpoint_with_cuda_states(train::Trainer& trainer, const std::vector<at::Tensor>& states) {
  torch::serialize::OutputArchive out;
  trainer.save(out);
  out.write("rng/cuda_count", torch::tensor(static_cast<int64_t>(states.size())));
  for (size_t i = 0; i < states.size(); ++i) {
    out.write("rng/cuda/" + std::to_string(i), states[i]);
  }
  std::stringstream bytes;
  out.save_to(bytes);
  return bytes.str();
}

}  // namespace

TEST_CASE("Trainer checkpoints hold every CUDA generator, and other device counts load with one warning",
          "[train][trainer][resume][rng]") {
  auto loader = trainkit::test::toy_loader(5);
  Setup first(1, train::TrainerOptions().epochs(1).max_steps(3));
  first.trainer->fit(loader);
  const int64_t here = static_cast<int64_t>(torch::cuda::device_count());
  {
    torch::serialize::OutputArchive out;
    first.trainer->save(out);
    std::stringstream bytes;
    out.save_to(bytes);
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    at::Tensor count;
    REQUIRE(in.try_read("rng/cuda_count", count));
    CHECK(count.item<int64_t>() == here);
  }
  SECTION("a checkpoint of this machine loads without a warning") {
    std::stringstream bytes;
    torch::serialize::OutputArchive out;
    first.trainer->save(out);
    out.save_to(bytes);
    Setup second(2, train::TrainerOptions().epochs(1));
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    LogCapture log;
    second.trainer->load(in);
    CHECK(log.text().find("CUDA device") == std::string::npos);
  }
  SECTION("a checkpoint from a machine with two more GPUs says once that the CUDA streams differ") {
    // A CUDA generator's state is 16 bytes: seed and offset (Philox); the values do not matter here, since
    // only the devices this process has are restored.
    const std::vector<at::Tensor> states(static_cast<size_t>(here + 2), torch::full({16}, 1, torch::kUInt8));
    std::stringstream bytes(checkpoint_with_cuda_states(*first.trainer, states));
    Setup second(2, train::TrainerOptions().epochs(1));
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    LogCapture log;
    second.trainer->load(in);
    const std::string text = log.text();
    INFO(text);
    CHECK(text.find(fmt::format("holds the random state of {} CUDA devices, this process has {}", here + 2, here)) !=
          std::string::npos);
    CHECK(text.find("Trainer::load") == text.rfind("Trainer::load"));  // one warning
    trainkit::test::require_bitwise_equal_modules(*first.model, *second.model);
  }
}

/// Saves a trained Trainer, draws on each of `devices`, loads the checkpoint into a second Trainer and
/// checks that each device draws the same numbers again.
void check_device_draws_repeat_after_load(const std::vector<c10::Device>& devices) {
  auto loader = trainkit::test::toy_loader(5);
  Setup first(1, train::TrainerOptions().epochs(1).max_steps(3));
  first.trainer->fit(loader);
  std::stringstream bytes;
  torch::serialize::OutputArchive out;
  first.trainer->save(out);
  out.save_to(bytes);
  std::vector<at::Tensor> before;
  for (const c10::Device& device : devices) {
    before.push_back(torch::rand({8}, torch::TensorOptions().device(device)).cpu());  // draws after the save
  }
  Setup second(2, train::TrainerOptions().epochs(1));
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  second.trainer->load(in);
  for (size_t i = 0; i < devices.size(); ++i) {
    INFO(devices[i]);
    CHECK(torch::equal(torch::rand({8}, torch::TensorOptions().device(devices[i])).cpu(), before[i]));
  }
}

TEST_CASE("Trainer checkpoints restore the CUDA generators", "[train][trainer][resume][rng][cuda]") {
  if (!torch::cuda::is_available()) {
    TRAINKIT_SKIP("no CUDA device: the CUDA generators cannot be restored here");
  }
  check_device_draws_repeat_after_load({c10::Device(torch::kCUDA, 0)});
}

TEST_CASE("Trainer checkpoints restore every device's generator, the test device's here",
          "[train][trainer][resume][rng][testdev]") {
  check_device_draws_repeat_after_load({trainkit::test::test_device(0), trainkit::test::test_device(1)});
}

TEST_CASE("Trainer hooks see each step and epoch and can stop training", "[train][trainer]") {
  auto loader = trainkit::test::toy_loader(3);
  auto val = trainkit::test::toy_loader(4, 40);
  Setup s(2, train::TrainerOptions().epochs(4));
  auto rec = std::make_shared<Recorder>();
  rec->stop_at = 30;
  s.trainer->add_callback(rec);
  s.trainer->fit(loader, &val);
  CHECK(s.trainer->state().step == 30);
  CHECK(s.trainer->state().epoch == 2);
  CHECK(s.trainer->state().batch == 6);
  REQUIRE(rec->steps.size() == 30);
  REQUIRE(rec->epochs.size() == 2);
  CHECK(rec->epochs[1].epoch == 1);
  CHECK(rec->epochs[1].step == 24);
  REQUIRE(rec->epochs[1].val.has_value());
  CHECK(rec->epochs[1].val->samples == 40);
  CHECK(rec->epochs[1].train_loss < rec->epochs[0].train_loss);
  CHECK(rec->epochs[1].val->metric("accuracy") > 0.5);  // 3 classes: chance is 1/3

  const train::EvalResult r1 = s.trainer->evaluate(val);
  const train::EvalResult r2 = s.trainer->evaluate(val);
  CHECK(r1.loss == r2.loss);  // evaluation runs without dropout
  CHECK(r1.metric("accuracy") == r2.metric("accuracy"));
  CHECK(s.model->is_training());  // evaluate() restores the mode
}

TEST_CASE("Trainer holds no_sync over every micro-batch but the last of its window", "[train][trainer]") {
  // 7 batches per epoch in windows of 3: 3, 3 and a short last window of 1. Micro-batches 0, 1, 3, 4 of
  // each epoch run under no_sync; 2, 5 and 6 synchronise. The same with a source of unknown length, whose
  // last batch is found by reading one ahead.
  for (const bool known_length : {true, false}) {
    DYNAMIC_SECTION((known_length ? "known length" : "unknown length")) {
      auto loader = trainkit::test::toy_loader(3, 56);
      data::FunctionSource unknown(
          [&loader](int64_t epoch, int64_t index) -> std::optional<data::Batch> {
            if (index == 0) loader.set_epoch(epoch);
            return loader.next();
          });
      data::BatchSource& source = known_length ? static_cast<data::BatchSource&>(loader) : unknown;
      Setup s(2, train::TrainerOptions().epochs(2).accumulation_steps(3));
      // Gradients are None at a window's start (zero_grad sets them to None), so "with grad" at the exit of
      // micro-batch 0 or 3 shows that its backward ran inside the guard.
      struct Guard {
        Guard(std::vector<std::string>& l, train::Trainer& t) : log(l), trainer(t) {}
        Guard(const Guard&) = delete;
        Guard& operator=(const Guard&) = delete;
        std::vector<std::string>& log;
        train::Trainer& trainer;
        ~Guard() {
          const bool has_grad = trainer.module().parameters().front().grad().defined();
          log.push_back("exit " + std::to_string(trainer.state().batch) + (has_grad ? " with grad" : ""));
        }
      };
      std::vector<std::string> log;
      s.trainer->set_no_sync([&log, &s] {
        log.push_back("enter " + std::to_string(s.trainer->state().batch));
        return std::make_shared<Guard>(log, *s.trainer);
      });
      s.trainer->fit(source);
      CHECK(s.trainer->state().step == 6);
      const std::vector<std::string> expected{
          "enter 0", "exit 0 with grad", "enter 1", "exit 1 with grad", "enter 3", "exit 3 with grad",
          "enter 4", "exit 4 with grad",  // epoch 0
          "enter 0", "exit 0 with grad", "enter 1", "exit 1 with grad", "enter 3", "exit 3 with grad",
          "enter 4", "exit 4 with grad"};  // epoch 1
      CHECK(log == expected);
    }
  }
}
