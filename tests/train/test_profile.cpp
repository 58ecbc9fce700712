// Step-time profile and profiler traces: each phase is charged the time spent in it (a data source and a
// hook that sleep known amounts), the counts follow steps and micro-batches, the phases add up to no more
// than the step time, profile(false) measures nothing, and ProfilerTrace writes a Chrome trace holding
// exactly the recorded steps' phases. NormMonitor's per-parameter norms equal norms of the gradients and
// weights copied at the same moment (unscaled under a GradScaler).
#include <chrono>
#include <cmath>
#include <map>
#include <thread>

#include <torch/torch.h>

#include "support.h"
#include "toy_problem.h"
#include "trainkit/data/batch_source.h"
#include "trainkit/nn/models.h"
#include "trainkit/amp/grad_scaler.h"
#include "trainkit/train/callbacks/metrics_logger.h"
#include "trainkit/train/callbacks/norm_monitor.h"
#include "trainkit/train/callbacks/profiler_trace.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;

namespace {

constexpr double kDataSleep = 0.004;      // seconds per batch the source sleeps
constexpr double kCallbackSleep = 0.003;  // seconds per step the hook sleeps

void sleep_for(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

/// The toy problem's batches, each delivered after kDataSleep.
data::FunctionSource slow_source(data::TensorLoader& loader) {
  return data::FunctionSource(
      [&loader](int64_t epoch, int64_t index) -> std::optional<data::Batch> {
        if (index >= loader.num_batches()) {
          return std::nullopt;
        }
        loader.set_epoch(epoch);
        sleep_for(kDataSleep);
        return loader.batch(index);
      },
      loader.num_batches());
}

class SlowHook : public train::Callback {
 public:
  std::vector<train::StepTimes> epochs;
  bool on_step_end(train::Trainer&, const train::StepEvent&) override {
    sleep_for(kCallbackSleep);
    return false;
  }
  bool on_epoch_end(train::Trainer& trainer, const train::EpochEvent& e) override {
    epochs.push_back(e.times);
    return false;
  }
};

struct Model {
  torch::nn::Sequential net;
  std::unique_ptr<torch::optim::Adam> optimizer;
  Model() {
    torch::manual_seed(0);
    net = nn::make_mlp(nn::MlpOptions().in_features(16).hidden({32}).num_classes(3));
    optimizer = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
  }
};


}  // namespace

TEST_CASE("The step-time profile charges each phase its time", "[train][profile]") {
  auto loader = test::toy_loader(3);  // 12 batches of 8
  auto source = slow_source(loader);
  auto val = test::toy_loader(4, 40);
  Model m;
  const int64_t accumulation = GENERATE(1, 2);
  train::Trainer trainer(m.net, *m.optimizer, train::TrainerOptions().epochs(2).accumulation_steps(accumulation));
  auto hook = std::make_shared<SlowHook>();
  trainer.add_callback(hook);
  trainer.fit(source, &val);

  REQUIRE(hook->epochs.size() == 2);
  for (const auto& t : hook->epochs) {
    CHECK(t.micro_batches == 12);
    CHECK(t.steps == 12 / accumulation);
    // 13 requests per epoch (the 13th finds the end without sleeping): at least 12 sleeps.
    CHECK(t.data >= 12 * kDataSleep);
    CHECK(t.callbacks >= static_cast<double>(t.steps) * kCallbackSleep);
    CHECK(t.forward > 0);
    CHECK(t.backward > 0);
    CHECK(t.optimizer > 0);
    CHECK(t.validation > 0);
    const double phases = t.data + t.forward + t.backward + t.optimizer + t.callbacks;
    CHECK(phases <= t.total);
    CHECK(t.other() >= 0);
    CHECK(t.other() < t.total);
  }
  CHECK(trainer.epoch_times().steps == hook->epochs.back().steps);

  train::StepTimes sum = hook->epochs[0];
  sum += hook->epochs[1];
  CHECK(sum.steps == 2 * hook->epochs[0].steps);
  CHECK(sum.total == Approx(hook->epochs[0].total + hook->epochs[1].total));
  const std::string line = sum.to_string();
  CHECK_THAT(line, Catch::Contains(std::to_string(sum.steps) + " steps") && Catch::Contains("data ") &&
                       Catch::Contains("validation "));
  const std::string json = sum.to_json();
  CHECK_THAT(json, Catch::Contains("\"steps\":" + std::to_string(sum.steps) + ",") && Catch::Contains("\"other_s\":"));
}

TEST_CASE("profile(false) reads no clock, and a run stopped mid-epoch keeps its partial epoch", "[train][profile]") {
  auto loader = test::toy_loader(3);
  Model m;
  SECTION("off") {
    train::Trainer trainer(m.net, *m.optimizer, train::TrainerOptions().epochs(1).profile(false));
    auto hook = std::make_shared<SlowHook>();
    trainer.add_callback(hook);
    trainer.fit(loader);
    REQUIRE(hook->epochs.size() == 1);
    CHECK(hook->epochs[0].total == 0);
    CHECK(hook->epochs[0].data == 0);
    CHECK(hook->epochs[0].callbacks == 0);
    CHECK(hook->epochs[0].steps == 12);  // counts are kept
  }
  SECTION("stopped by max_steps") {
    train::Trainer trainer(m.net, *m.optimizer, train::TrainerOptions().epochs(3).max_steps(17));
    auto logging = std::make_shared<train::MetricsLogger>(nullptr, 100, false);
    trainer.add_callback(logging);
    trainer.fit(loader);
    REQUIRE(logging->epoch_step_times().size() == 2);  // epoch 1 whole, epoch 2's first 5 steps
    CHECK(logging->epoch_step_times()[0].steps == 12);
    CHECK(logging->epoch_step_times()[1].steps == 5);
    CHECK(logging->step_times().steps == 17);
  }
}

TEST_CASE("ProfilerTrace writes a Chrome trace of the recorded steps", "[train][profile][trace]") {
  test::TempDir dir("trace");
  auto loader = test::toy_loader(3);
  Model m;
  const std::string path = (dir.path() / "sub" / "trace.json").string();
  SECTION("a window inside the run") {
    train::Trainer trainer(m.net, *m.optimizer, train::TrainerOptions().epochs(1));
    auto trace = std::make_shared<train::ProfilerTrace>(train::ProfilerTraceOptions(path).wait(2).active(3));
    trainer.add_callback(trace);
    trainer.fit(loader);
    REQUIRE(trace->written());
    CHECK(trace->steps_recorded() == 3);
    const std::string json = test::read_text(path);
    CHECK_THAT(json, Catch::Contains("traceEvents"));
    // Recording starts after step 2's hooks and stops inside step 5's: the forward, backward and optimizer
    // of steps 3, 4 and 5.
    CHECK(test::count_occurrences(json, "\"trainkit::forward\"") == 3);
    CHECK(test::count_occurrences(json, "\"trainkit::backward\"") == 3);
    CHECK(test::count_occurrences(json, "\"trainkit::optimizer\"") == 3);
    CHECK(test::count_occurrences(json, "\"aten::addmm\"") >= 3);  // LibTorch's own operators are in it too
  }
  SECTION("training ends inside the window") {
    train::Trainer trainer(m.net, *m.optimizer, train::TrainerOptions().epochs(1).max_steps(4));
    auto trace = std::make_shared<train::ProfilerTrace>(train::ProfilerTraceOptions(path).wait(2).active(10));
    trainer.add_callback(trace);
    trainer.fit(loader);
    REQUIRE(trace->written());
    CHECK(trace->steps_recorded() == 2);
    CHECK(test::count_occurrences(test::read_text(path), "\"trainkit::optimizer\"") == 2);
  }
  SECTION("bad options") {
    CHECK_THROWS_WITH(train::ProfilerTrace(train::ProfilerTraceOptions(path).active(0)),
                      Catch::Contains("invalid active: 0"));
    CHECK_THROWS_WITH(train::ProfilerTrace(train::ProfilerTraceOptions("")), Catch::Contains("path"));
  }
}

namespace {

/// Copies every gradient and parameter when the optimizer is about to step (added before NormMonitor).
class GradRecorder : public train::Callback {
 public:
  explicit GradRecorder(const torch::nn::Module& m) : module(m) {}
  const torch::nn::Module& module;
  std::map<int64_t, std::vector<std::pair<at::Tensor, at::Tensor>>> at_step;
  void on_before_optimizer_step(train::Trainer& trainer) override {
    auto& v = at_step[trainer.state().step + 1];
    for (const auto& p : module.parameters()) {
      v.emplace_back(p.grad().detach().to(torch::kFloat64).clone(), p.detach().to(torch::kFloat64).clone());
    }
  }
};

double norm2(const at::Tensor& t) { return std::sqrt(t.pow(2).sum().item<double>()); }

}  // namespace

TEST_CASE("NormMonitor measures each parameter's gradient and weight norm every N steps", "[train][monitors]") {
  test::TempDir dir("layer-norms");
  auto loader = test::toy_loader(3);
  Model m;
  const bool scaled = GENERATE(false, true);
  train::Trainer trainer(m.net, *m.optimizer, train::TrainerOptions().epochs(1));
  if (scaled) {  // no clipping: the gradients are still scaled when the hook runs
    trainer.set_grad_scaler(std::make_shared<amp::GradScaler>(
        torch::kCPU, amp::GradScalerOptions().init_scale(1024.0).growth_interval(1000)));
  }
  auto recorder = std::make_shared<GradRecorder>(*m.net);
  auto norms = std::make_shared<train::NormMonitor>(
      *m.net, train::NormMonitorOptions().every_steps(5).csv_path(dir.str("norms.csv")));
  trainer.add_callback(recorder);
  trainer.add_callback(norms);
  trainer.fit(loader);  // 12 steps: measured at 5 and 10

  CHECK(norms->last_step() == 10);
  const auto& expected = recorder->at_step.at(10);
  REQUIRE(norms->last().size() == expected.size());
  const double scale = scaled ? 1024.0 : 1.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO(norms->last()[i].name);
    CHECK(norms->last()[i].grad_norm == Approx(norm2(expected[i].first) / scale).epsilon(1e-12));
    CHECK(norms->last()[i].param_norm == Approx(norm2(expected[i].second)).epsilon(1e-12));
  }
  CHECK(norms->last()[0].name == "1.weight");  // make_mlp: Flatten, then Linear
  const std::string csv = test::read_text(dir.str("norms.csv"));
  CHECK(csv.rfind("step,name,grad_norm,param_norm\n5,1.weight,", 0) == 0);
  CHECK(test::count_occurrences(csv, "\n5,") == static_cast<int64_t>(expected.size()));
  CHECK(test::count_occurrences(csv, "\n10,") == static_cast<int64_t>(expected.size()));
  CHECK_THROWS_WITH(train::NormMonitor(*m.net, train::NormMonitorOptions().every_steps(0)),
                    Catch::Contains("invalid every_steps: 0"));
}
