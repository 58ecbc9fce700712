// Everything device-generic runs on the test accelerator (device/testdev.h) and gives the CPU's numbers
// (issue 43, item 2): the Trainer (fit, evaluate, metrics, hooks, step-based validation, save/load), every
// optimizer on its non-CPU paths, clipping, accumulation, the GradScaler's device path, EMA/SWA,
// DeviceSource, activation checkpointing and TorchScript models. The test device runs ATen's CPU kernels, so
// a computation that takes the same path on both is bitwise equal; where the CPU takes a path of its own
// (trainkit's fused CPU kernels) the device's path is compared to 1e-6 relative (float32). A difference is a
// defect of the device path: a host copy, a CPU tensor mixed into a device op, a CPU-only kernel or the CPU's
// generator used for a device tensor.
#include <atomic>
#include <functional>
#include <limits>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "device/testdev.h"
#include "support.h"
#include "trainkit/amp/grad_scaler.h"
#include "trainkit/data/device_source.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/grad/accumulation.h"
#include "trainkit/grad/clip.h"
#include "trainkit/nn/activation_checkpoint.h"
#include "trainkit/nn/models.h"
#include "trainkit/nn/script_module.h"
#include "trainkit/optim.h"
#include "trainkit/sched/cosine.h"
#include "trainkit/train/callbacks/ema_weight_averaging.h"
#include "trainkit/train/callbacks/stochastic_weight_averaging.h"
#include "trainkit/train/ema.h"
#include "trainkit/train/swa.h"
#include "trainkit/train/trainer.h"

using namespace trainkit;
using trainkit::test::test_device;
using trainkit::test::TransferCounter;

namespace {

/// How a device result must equal the CPU's.
enum class Match {
  kBitwise,  ///< the same bits (both ran the same CPU kernels)
  kClose,    ///< to 1e-6 relative (float32; the CPU took a path of its own)
};

const char* to_string(Match m) { return m == Match::kBitwise ? "bitwise" : "to 1e-6"; }

/// `dev` (any device) equals `cpu` as `m` asks.
bool same(const at::Tensor& cpu, const at::Tensor& dev, Match m) {
  const at::Tensor d = dev.detach().cpu();
  const at::Tensor c = cpu.detach().cpu();
  if (m == Match::kBitwise) {
    return torch::equal(c, d);
  }
  return c.sizes() == d.sizes() && torch::allclose(d, c, 1e-6, 1e-7);
}

bool same(double cpu, double dev, Match m) {
  return m == Match::kBitwise ? cpu == dev : dev == Approx(cpu).epsilon(1e-6).margin(1e-7);
}

/// Every parameter and buffer of `dev` (on the test device) equals that of `cpu`.
void check_modules(torch::nn::Module& cpu, torch::nn::Module& dev, Match m) {
  const auto pc = cpu.named_parameters();
  const auto pd = dev.named_parameters();
  REQUIRE(pc.size() == pd.size());
  for (const auto& item : pc) {
    INFO("parameter " << item.key() << " (" << to_string(m) << ")");
    CHECK(pd[item.key()].device() == test_device());
    CHECK(same(item.value(), pd[item.key()], m));
  }
  const auto bc = cpu.named_buffers();
  const auto bd = dev.named_buffers();
  REQUIRE(bc.size() == bd.size());
  for (const auto& item : bc) {
    INFO("buffer " << item.key() << " (" << to_string(m) << ")");
    CHECK(bd[item.key()].device() == test_device());
    CHECK(same(item.value(), bd[item.key()], m));
  }
}

void check_tensors(const std::vector<at::Tensor>& cpu, const std::vector<at::Tensor>& dev, Match m,
                   const std::string& what) {
  REQUIRE(cpu.size() == dev.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO(what << " " << i << " (" << to_string(m) << ")");
    CHECK(dev[i].device() == test_device());
    CHECK(same(cpu[i], dev[i], m));
  }
}

/// n samples of 16 features labelled by the argmax of the first 3, on the CPU (as tests/train/toy_problem.h).
data::TensorLoader toy_loader(uint64_t seed, int64_t n = 96) {
  torch::manual_seed(1234);
  const at::Tensor x = torch::randn({n, 16});
  const at::Tensor y = x.narrow(1, 0, 3).argmax(1);
  return data::TensorLoader(x, y, data::TensorLoaderOptions().batch_size(8).seed(seed));
}

/// What the Trainer's hooks saw.
class Recorder : public train::Callback {
 public:
  int64_t begins = 0, ends = 0, before_steps = 0, epoch_ends = 0;
  std::vector<int64_t> steps;
  std::vector<double> step_losses;
  std::vector<c10::Device> loss_devices;
  std::vector<train::EpochEvent> points;  // every validation point

  void on_train_begin(train::Trainer&) override { ++begins; }
  void on_before_optimizer_step(train::Trainer&) override { ++before_steps; }
  bool on_step_end(train::Trainer&, const train::StepEvent& e) override {
    steps.push_back(e.step);
    step_losses.push_back(e.loss.item<double>());
    loss_devices.push_back(e.loss.device());
    return false;
  }
  bool on_validation_point(train::Trainer&, const train::EpochEvent& e) override {
    points.push_back(e);
    return false;
  }
  bool on_epoch_end(train::Trainer&, const train::EpochEvent&) override {
    ++epoch_ends;
    return false;
  }
  void on_train_end(train::Trainer&) override { ++ends; }
};

/// The toy MLP (16 → 32 → 3) on `device`, its optimizer and a Trainer reporting accuracy and top-2 accuracy.
struct TrainRun {
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<train::Trainer> trainer;
  std::shared_ptr<Recorder> log = std::make_shared<Recorder>();

  /// With torch::optim::Adam, which runs the same ATen ops on both devices.
  TrainRun(c10::Device device, train::TrainerOptions options, double dropout = 0.0, uint64_t seed = 1) {
    torch::manual_seed(seed);
    model = nn::make_mlp(nn::MlpOptions().in_features(16).hidden({32}).dropout(dropout).num_classes(3));
    model->to(device);
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
    trainer = std::make_unique<train::Trainer>(model, *optimizer, options);
    trainer->set_metrics({train::accuracy(), train::top_k_accuracy(2)});
    trainer->add_callback(log);
  }
};

void check_eval(const train::EvalResult& cpu, const train::EvalResult& dev, Match m) {
  CHECK(cpu.samples == dev.samples);
  CHECK(same(cpu.loss, dev.loss, m));
  REQUIRE(cpu.metrics.items().size() == dev.metrics.items().size());
  for (size_t i = 0; i < cpu.metrics.items().size(); ++i) {
    INFO("metric " << cpu.metrics.items()[i].first);
    CHECK(cpu.metrics.items()[i].first == dev.metrics.items()[i].first);
    CHECK(same(cpu.metrics.items()[i].second, dev.metrics.items()[i].second, m));
  }
}

/// The hooks of both runs saw the same steps, losses and validation points.
void check_logs(const Recorder& cpu, const Recorder& dev, Match m) {
  CHECK(dev.begins == cpu.begins);
  CHECK(dev.ends == cpu.ends);
  CHECK(dev.before_steps == cpu.before_steps);
  CHECK(dev.epoch_ends == cpu.epoch_ends);
  CHECK(dev.steps == cpu.steps);
  REQUIRE(dev.step_losses.size() == cpu.step_losses.size());
  for (size_t i = 0; i < cpu.step_losses.size(); ++i) {
    INFO("step " << cpu.steps[i] << " loss");
    CHECK(same(cpu.step_losses[i], dev.step_losses[i], m));
    CHECK(dev.loss_devices[i] == test_device());  // the step's loss stays on the device
  }
  REQUIRE(dev.points.size() == cpu.points.size());
  for (size_t i = 0; i < cpu.points.size(); ++i) {
    const auto& c = cpu.points[i];
    const auto& d = dev.points[i];
    INFO("validation point " << i << " at step " << c.step);
    CHECK(d.step == c.step);
    CHECK(d.epoch == c.epoch);
    CHECK(d.epoch_end == c.epoch_end);
    CHECK(same(c.train_loss, d.train_loss, m));
    REQUIRE(d.val.has_value() == c.val.has_value());
    if (c.val) {
      check_eval(*c.val, *d.val, m);
    }
    REQUIRE(d.metrics.items().size() == c.metrics.items().size());
    for (size_t k = 0; k < c.metrics.items().size(); ++k) {
      INFO("metric " << c.metrics.items()[k].first);
      CHECK(d.metrics.items()[k].first == c.metrics.items()[k].first);
      CHECK(same(c.metrics.items()[k].second, d.metrics.items()[k].second, m));
    }
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------ Trainer

TEST_CASE("Trainer on the test device: fit, evaluate, metrics, hooks and step-based validation equal the CPU's bit "
          "for bit",
          "[testdev][train]") {
  auto loader = toy_loader(5);
  auto val = toy_loader(6, 40);
  data::DeviceSource loader_dev(loader, test_device());
  data::DeviceSource val_dev(val, test_device());
  // 12 batches per epoch; validation after steps 5, 10, 15, 20 and at both epochs' ends.
  const auto options = train::TrainerOptions().epochs(2).val_every_steps(5);
  TrainRun cpu(torch::kCPU, options);
  TrainRun dev(test_device(), options);
  cpu.trainer->fit(loader, &val);
  dev.trainer->fit(loader_dev, &val_dev);

  REQUIRE(dev.trainer->state().step == 24);
  REQUIRE(cpu.log->points.size() == 6);
  check_logs(*cpu.log, *dev.log, Match::kBitwise);
  check_modules(*cpu.model, *dev.model, Match::kBitwise);
  CHECK(dev.trainer->state().epoch_loss_sum.device() == test_device());
  check_eval(cpu.trainer->evaluate(val), dev.trainer->evaluate(val_dev), Match::kBitwise);
}

TEST_CASE("Trainer on the test device: norm and value clipping, 3-step accumulation and a per-step scheduler equal "
          "the CPU's",
          "[testdev][train][grad]") {
  auto loader = toy_loader(5);
  auto val = toy_loader(6, 40);
  data::DeviceSource loader_dev(loader, test_device());
  data::DeviceSource val_dev(val, test_device());
  // 12 micro-batches per epoch, 3 per step: 4 steps per epoch.
  const auto options =
      train::TrainerOptions().epochs(2).accumulation_steps(3).clip_grad_norm(0.5).clip_grad_value(0.05);
  TrainRun cpu(torch::kCPU, options);
  TrainRun dev(test_device(), options);
  for (TrainRun* run : {&cpu, &dev}) {
    run->trainer->set_scheduler(
        std::make_shared<sched::CosineAnnealingLR>(*run->optimizer, sched::CosineAnnealingLROptions(8)), true);
  }
  cpu.trainer->fit(loader, &val);
  dev.trainer->fit(loader_dev, &val_dev);
  REQUIRE(dev.trainer->state().step == 8);
  REQUIRE(dev.trainer->last_grad_norm().defined());
  CHECK(dev.trainer->last_grad_norm().device() == test_device());
  CHECK(same(cpu.trainer->last_grad_norm(), dev.trainer->last_grad_norm(), Match::kClose));
  // The CPU clips with trainkit's fused CPU kernel, the device with ATen's foreach ops: the same math, in
  // another order of summation.
  check_logs(*cpu.log, *dev.log, Match::kClose);
  check_modules(*cpu.model, *dev.model, Match::kClose);
  CHECK(cpu.optimizer->param_groups()[0].options().get_lr() == dev.optimizer->param_groups()[0].options().get_lr());
}

namespace {

/// A run of 3 epochs on the test device straight through, and the same run interrupted after `stop` steps,
/// saved, loaded into fresh objects (another init seed) and finished: their models and hooks' records.
void check_resume_on_device(double dropout) {
  auto loader = toy_loader(5);
  auto val = toy_loader(6, 40);
  data::DeviceSource loader_dev(loader, test_device());
  data::DeviceSource val_dev(val, test_device());
  const auto options = train::TrainerOptions().epochs(3).val_every_steps(7);
  TrainRun straight(test_device(), options, dropout);
  straight.trainer->fit(loader_dev, &val_dev);
  REQUIRE(straight.trainer->state().step == 36);
  for (const int64_t stop : {9, 12}) {  // mid-epoch, at an epoch's end
    INFO("interrupted after step " << stop);
    std::stringstream saved;
    {
      TrainRun first(test_device(), train::TrainerOptions(options).max_steps(stop), dropout);
      first.trainer->fit(loader_dev, &val_dev);
      REQUIRE(first.trainer->state().step == stop);
      torch::serialize::OutputArchive out;
      first.trainer->save(out);
      out.save_to(saved);
      // Disturb the generators a checkpoint must restore, the device's among them.
      torch::rand({100});
      torch::rand({100}, torch::TensorOptions().device(test_device()));
    }
    TrainRun second(test_device(), options, dropout, /*seed=*/99);
    torch::serialize::InputArchive in;
    in.load_from(saved);
    second.trainer->load(in);
    second.trainer->fit(loader_dev, &val_dev);
    CHECK(second.trainer->state().step == 36);
    REQUIRE(!second.log->steps.empty());
    CHECK(second.log->steps.front() == stop + 1);
    check_modules(*straight.model, *second.model, Match::kBitwise);
    REQUIRE(!second.log->points.empty());
    const auto& last = second.log->points.back();
    const auto& expected = straight.log->points.back();
    CHECK(last.train_loss == expected.train_loss);
    CHECK(last.val->loss == expected.val->loss);
    CHECK(last.val->metrics.at("accuracy") == expected.val->metrics.at("accuracy"));
  }
}

}  // namespace

TEST_CASE("Trainer on the test device: save, load and finish equals an uninterrupted run", "[testdev][train][resume]") {
  check_resume_on_device(0.0);
}

TEST_CASE("Trainer on the test device with dropout: a resumed run draws the device generator's masks of the "
          "uninterrupted run",
          "[testdev][train][resume]") {
  // Dropout draws from the test device's generator (the CPU run's masks are another stream by design), so
  // the comparison is device against device: the checkpoint must hold the device's generator.
  check_resume_on_device(0.2);
}

TEST_CASE("Trainer: a checkpoint saved on the test device loads on the CPU and continues as the CPU run",
          "[testdev][train][resume]") {
  auto loader = toy_loader(5);
  data::DeviceSource loader_dev(loader, test_device());
  const auto options = train::TrainerOptions().epochs(2);
  TrainRun straight(torch::kCPU, options);
  straight.trainer->fit(loader);
  std::stringstream saved;
  {
    TrainRun first(test_device(), train::TrainerOptions(options).max_steps(9));
    first.trainer->fit(loader_dev);
    torch::serialize::OutputArchive out;
    first.trainer->save(out);
    out.save_to(saved);
  }
  TrainRun second(torch::kCPU, options, 0.0, 99);
  torch::serialize::InputArchive in;
  in.load_from(saved, torch::kCPU);  // as torch.load(map_location="cpu"): else the tensors load onto testdev
  second.trainer->load(in);
  second.trainer->fit(loader);
  CHECK(second.trainer->state().step == 24);
  for (const auto& p : second.model->parameters()) {
    CHECK(p.device().is_cpu());
  }
  // Both halves ran the CPU's kernels: the same bits as the CPU run throughout.
  const auto pa = straight.model->named_parameters();
  for (const auto& item : second.model->named_parameters()) {
    INFO(item.key());
    CHECK(torch::equal(item.value(), pa[item.key()]));
  }
  REQUIRE(!second.log->points.empty());
  CHECK(second.log->points.back().train_loss == straight.log->points.back().train_loss);
}

// ----------------------------------------------------------------------------------------------- optimizers

namespace {

using OptimizerPtr = std::unique_ptr<torch::optim::Optimizer>;
using MakeOptimizer = std::function<OptimizerPtr(const std::vector<at::Tensor>&)>;

/// Parameters of a few shapes (float32), seeded, on `device`.
std::vector<at::Tensor> make_params(c10::Device device) {
  torch::manual_seed(21);
  std::vector<at::Tensor> out;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{12, 5}, {5}, {3, 4, 2}, {1}}) {
    out.push_back(torch::randn(shape).to(device).requires_grad_());
  }
  return out;
}

/// Gradients of step `step` (the same on every device).
void set_grads(std::vector<at::Tensor>& params, int step) {
  for (size_t i = 0; i < params.size(); ++i) {
    const auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(100 * step + i));
    params[i].mutable_grad() = torch::randn(params[i].sizes(), gen).to(params[i].device());
  }
}

/// The ATen ops whose names begin with `prefix` that `body` runs (from any thread).
int64_t count_ops(const std::string& prefix, const std::function<void()>& body) {
  static std::string s_prefix;
  static std::atomic<int64_t> s_count{0};
  s_prefix = prefix;
  s_count = 0;
  const auto handle = at::addGlobalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (std::string(fn.name()).rfind(s_prefix, 0) == 0) {
          ++s_count;
        }
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  body();
  at::removeCallback(handle);
  return s_count.load();
}

/// Steps the optimizers `make_cpu` and `make_dev` build over equal parameters on the CPU and the test device
/// 6 times with equal gradients, then steps a copy of each loaded from the other's save for 2 more (a state
/// saved on the device continues on the device); the parameters after every step must match. With
/// `device_ops`, every device step must run ops whose names begin with it (the path it is meant to take).
void check_optimizer(const MakeOptimizer& make_cpu, const MakeOptimizer& make_dev, Match m,
                     const std::string& device_ops = "") {
  auto pc = make_params(torch::kCPU);
  auto pd = make_params(test_device());
  OptimizerPtr oc = make_cpu(pc);
  OptimizerPtr od = make_dev(pd);
  for (int step = 0; step < 6; ++step) {
    set_grads(pc, step);
    set_grads(pd, step);
    oc->step();
    const int64_t ops = count_ops(device_ops, [&] { od->step(); });
    INFO("after step " << step + 1);
    if (!device_ops.empty()) {
      CHECK(ops > 0);  // the device took the path the case names
    }
    check_tensors(pc, pd, m, "parameter");
  }
  // The device optimizer's state saved and loaded into a fresh one over the same device parameters.
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive out;
    od->save(out);
    out.save_to(bytes);
  }
  OptimizerPtr loaded = make_dev(pd);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  loaded->load(in);
  for (int step = 6; step < 8; ++step) {
    set_grads(pc, step);
    set_grads(pd, step);
    oc->step();
    loaded->step();
    INFO("after step " << step + 1 << ", the device optimizer loaded from its save");
    check_tensors(pc, pd, m, "parameter");
  }
}

template <class Opt, class Options>
MakeOptimizer maker(Options options) {
  return [options](const std::vector<at::Tensor>& p) { return std::make_unique<Opt>(p, options); };
}

}  // namespace

TEST_CASE("Every optimizer on the test device: the foreach path (its default off the CPU) equals the CPU's",
          "[testdev][optim]") {
  using namespace trainkit::optim;
  // Off the CPU each takes `_foreach_*` ops by default; the same ops on the CPU (foreach = true) give the same
  // bits, the CPU's own fused kernels (its default) the same values to 1e-6.
  SECTION("Adam") {
    const auto o = AdamOptions(1e-2).weight_decay(0.1);
    check_optimizer(maker<Adam>(AdamOptions(o).foreach(true)), maker<Adam>(o), Match::kBitwise, "aten::_foreach_");
    check_optimizer(maker<Adam>(o), maker<Adam>(o), Match::kClose);
  }
  SECTION("Adam amsgrad, maximize") {
    const auto o = AdamOptions(1e-2).amsgrad(true).maximize(true);
    check_optimizer(maker<Adam>(AdamOptions(o).foreach(true)), maker<Adam>(o), Match::kBitwise, "aten::_foreach_");
  }
  SECTION("AdamW") {
    const auto o = AdamWOptions(1e-2).weight_decay(0.05).amsgrad(true);
    check_optimizer(maker<AdamW>(AdamWOptions(o).foreach(true)), maker<AdamW>(o), Match::kBitwise, "aten::_foreach_");
    check_optimizer(maker<AdamW>(o), maker<AdamW>(o), Match::kClose);
  }
  SECTION("SGD with Nesterov momentum") {
    const auto o = SgdOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3);
    check_optimizer(maker<Sgd>(SgdOptions(o).foreach(true)), maker<Sgd>(o), Match::kBitwise, "aten::_foreach_");
    check_optimizer(maker<Sgd>(o), maker<Sgd>(o), Match::kClose);
  }
  SECTION("SGD with dampening") {
    const auto o = SgdOptions(0.05).momentum(0.8).dampening(0.1);
    check_optimizer(maker<Sgd>(SgdOptions(o).foreach(true)), maker<Sgd>(o), Match::kBitwise, "aten::_foreach_");
  }
  SECTION("LARS") {
    const auto o = LarsOptions(0.1).momentum(0.9).weight_decay(1e-4).trust_coefficient(1e-3);
    check_optimizer(maker<Lars>(LarsOptions(o).foreach(true)), maker<Lars>(o), Match::kBitwise, "aten::_foreach_");
    check_optimizer(maker<Lars>(o), maker<Lars>(o), Match::kClose);
  }
  SECTION("LARS with trust_clip and always_adapt") {
    const auto o = LarsOptions(0.1).momentum(0.9).nesterov(true).trust_clip(true).always_adapt(true);
    check_optimizer(maker<Lars>(LarsOptions(o).foreach(true)), maker<Lars>(o), Match::kBitwise, "aten::_foreach_");
  }
  SECTION("LAMB") {
    // Its global gradient clip takes the norm as clipping does: trainkit's fused kernel on the CPU whatever
    // the group's path, ATen's foreach norms off it. So to 1e-6 even on the same path.
    const auto o = LambOptions(1e-2).weight_decay(0.01);
    check_optimizer(maker<Lamb>(LambOptions(o).foreach(true)), maker<Lamb>(o), Match::kClose, "aten::_foreach_");
    check_optimizer(maker<Lamb>(o), maker<Lamb>(o), Match::kClose);
  }
  SECTION("LAMB without gradient clipping or bias correction, trust_clip") {
    const auto o = LambOptions(1e-2).max_grad_norm(std::nullopt).bias_correction(false).trust_clip(true);
    check_optimizer(maker<Lamb>(LambOptions(o).foreach(true)), maker<Lamb>(o), Match::kBitwise, "aten::_foreach_");
  }
}

TEST_CASE("Every optimizer on the test device: the reference path (foreach = false) equals the CPU's bit for bit",
          "[testdev][optim]") {
  using namespace trainkit::optim;
  SECTION("Adam") {
    const auto o = AdamOptions(1e-2).weight_decay(0.1).fused(false).foreach(false);
    check_optimizer(maker<Adam>(o), maker<Adam>(o), Match::kBitwise);
  }
  SECTION("AdamW") {
    const auto o = AdamWOptions(1e-2).amsgrad(true).fused(false).foreach(false);
    check_optimizer(maker<AdamW>(o), maker<AdamW>(o), Match::kBitwise);
  }
  SECTION("SGD") {
    const auto o = SgdOptions(0.05).momentum(0.9).nesterov(true).fused(false).foreach(false);
    check_optimizer(maker<Sgd>(o), maker<Sgd>(o), Match::kBitwise);
  }
  SECTION("LARS") {
    const auto o = LarsOptions(0.1).momentum(0.9).weight_decay(1e-4).fused(false).foreach(false);
    check_optimizer(maker<Lars>(o), maker<Lars>(o), Match::kBitwise);
  }
  SECTION("LAMB") {
    const auto o = LambOptions(1e-2).fused(false).foreach(false);
    check_optimizer(maker<Lamb>(LambOptions(o).max_grad_norm(std::nullopt)),
                    maker<Lamb>(LambOptions(o).max_grad_norm(std::nullopt)), Match::kBitwise);
    check_optimizer(maker<Lamb>(o), maker<Lamb>(o), Match::kClose);  // the global norm: see above
  }
}

TEST_CASE("Adam, AdamW and SGD with fused = true on the test device take ATen's fused kernels, equal to the CPU's",
          "[testdev][optim][aten_fused]") {
  using namespace trainkit::optim;
  // Off the CPU `fused = true` chooses ATen's kernels (as on CUDA); on the CPU `aten_fused = true` does.
  SECTION("Adam") {
    const auto o = AdamOptions(1e-2).weight_decay(0.1);
    check_optimizer(maker<Adam>(AdamOptions(o).aten_fused(true)), maker<Adam>(AdamOptions(o).fused(true)),
                    Match::kBitwise, "aten::_fused_");
  }
  SECTION("AdamW amsgrad") {
    const auto o = AdamWOptions(1e-2).amsgrad(true);
    check_optimizer(maker<AdamW>(AdamWOptions(o).aten_fused(true)), maker<AdamW>(AdamWOptions(o).fused(true)),
                    Match::kBitwise, "aten::_fused_");
  }
  SECTION("SGD with Nesterov momentum") {
    const auto o = SgdOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3);
    check_optimizer(maker<Sgd>(SgdOptions(o).aten_fused(true)), maker<Sgd>(SgdOptions(o).fused(true)),
                    Match::kBitwise, "aten::_fused_");
  }
}

TEST_CASE("Optimizers made by the factory by name run on the test device", "[testdev][optim]") {
  for (const std::string name : {"adam", "adamw", "sgd", "lars", "lamb"}) {
    DYNAMIC_SECTION(name) {
      ArgTable table;
      set_arg(table, "lr", 0.01);
      ArgReader args(table, "test");
      const optim::OptimizerSpec spec = optim::parse_optimizer(name, args);
      const auto make = [&spec](const std::vector<at::Tensor>& p) { return optim::make_optimizer(spec, p); };
      check_optimizer(make, make, Match::kClose);
    }
  }
}

// ------------------------------------------------------------------------------------ clipping, accumulation

TEST_CASE("clip_grad_norm_, clip_grads_with_norm_, grad_norm and clip_grad_value_ on the test device equal the CPU's",
          "[testdev][grad][clip]") {
  for (const double norm_type : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    for (const double max_norm : {0.5, 1e3}) {  // clipping, and a norm under the limit
      INFO("norm_type " << norm_type << ", max_norm " << max_norm);
      auto pc = make_params(torch::kCPU);
      auto pd = make_params(test_device());
      set_grads(pc, 1);
      set_grads(pd, 1);
      const at::Tensor nc = grad::grad_norm(pc, norm_type);
      TransferCounter counter;
      const at::Tensor nd = grad::grad_norm(pd, norm_type);
      const at::Tensor total_d = grad::clip_grad_norm_(pd, max_norm, norm_type);
      CHECK(counter.to_host() == 0);  // the norm stays on the device
      const at::Tensor total_c = grad::clip_grad_norm_(pc, max_norm, norm_type);
      CHECK(nd.device() == test_device());
      CHECK(total_d.device() == test_device());
      CHECK(same(nc, nd, Match::kClose));
      CHECK(same(total_c, total_d, Match::kClose));
      std::vector<at::Tensor> gc, gd;
      for (size_t i = 0; i < pc.size(); ++i) {
        gc.push_back(pc[i].grad());
        gd.push_back(pd[i].grad());
      }
      check_tensors(gc, gd, Match::kClose, "clipped gradient");
      // The scaling half with a norm on the device.
      set_grads(pc, 2);
      set_grads(pd, 2);
      grad::clip_grads_with_norm_(pc, max_norm, grad::grad_norm(pc, norm_type));
      grad::clip_grads_with_norm_(pd, max_norm, grad::grad_norm(pd, norm_type));
      for (size_t i = 0; i < pc.size(); ++i) {
        CHECK(same(pc[i].grad(), pd[i].grad(), Match::kClose));
      }
    }
  }
  SECTION("value clipping is bitwise") {
    auto pc = make_params(torch::kCPU);
    auto pd = make_params(test_device());
    set_grads(pc, 3);
    set_grads(pd, 3);
    grad::clip_grad_value_(pc, 0.3);
    grad::clip_grad_value_(pd, 0.3);
    for (size_t i = 0; i < pc.size(); ++i) {
      CHECK(same(pc[i].grad(), pd[i].grad(), Match::kBitwise));
    }
  }
  SECTION("a non-finite gradient is named") {
    auto pd = make_params(test_device());
    set_grads(pd, 4);
    pd[2].mutable_grad()[1][2][0] = std::numeric_limits<float>::infinity();
    CHECK_THROWS_MATCHES(grad::clip_grad_norm_(pd, 1.0, 2.0, /*error_if_nonfinite=*/true), std::runtime_error,
                         trainkit::test::WhatContains("parameter 2 has a non-finite gradient"));
  }
}

TEST_CASE("Gradient accumulation in a hand-written loop on the test device equals the CPU's", "[testdev][grad]") {
  std::vector<torch::nn::Linear> models;
  std::vector<std::unique_ptr<torch::optim::SGD>> optimizers;
  for (const c10::Device device : {c10::Device(torch::kCPU), test_device()}) {
    torch::manual_seed(3);
    models.emplace_back(torch::nn::Linear(16, 3));
    models.back()->to(device);
    optimizers.push_back(
        std::make_unique<torch::optim::SGD>(models.back()->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)));
  }
  auto loader = toy_loader(2, 40);  // 5 micro-batches: windows of 2, 2 and 1
  for (size_t k = 0; k < 2; ++k) {
    const c10::Device device = models[k]->weight.device();
    grad::GradAccumulation acc(2, loader.num_batches());
    loader.set_epoch(0);
    int64_t steps = 0;
    while (auto b = loader.next()) {
      const data::Batch batch = b->to(device);
      (torch::cross_entropy_loss(models[k]->forward(batch.input()), batch.target()) * acc.loss_scale()).backward();
      if (acc.sync_now()) {
        optimizers[k]->step();
        optimizers[k]->zero_grad();
        ++steps;
      }
      acc.next();
    }
    CHECK(steps == 3);
  }
  check_modules(*models[0], *models[1], Match::kBitwise);
}

// ----------------------------------------------------------------------------------------------- GradScaler

namespace {

/// Parameters stepped with a GradScaler on their device through scale → backward → unscale_ → clip → step →
/// update, with an inf gradient at step 3 and a growth interval of 2; what the scaler saw each step.
struct ScalerTrace {
  std::vector<double> scales;
  std::vector<int64_t> trackers;
  std::vector<bool> stepped;
};

ScalerTrace run_scaler(std::vector<at::Tensor>& params, torch::optim::Optimizer& opt, amp::GradScaler& scaler,
                       bool unscale_first) {
  ScalerTrace trace;
  const c10::Device device = params.front().device();
  for (int step = 0; step < 6; ++step) {
    opt.zero_grad();
    at::Tensor loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (size_t i = 0; i < params.size(); ++i) {
      const auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(10 * step + i));
      const at::Tensor w = torch::randn(params[i].sizes(), gen).to(device);
      loss = loss + (params[i] * w).sum() + 0.5 * params[i].pow(2).sum();
    }
    if (step == 3) {
      loss = loss + params[1].sum() * std::numeric_limits<float>::infinity();
    }
    scaler.scale(loss).backward();
    if (unscale_first) {
      scaler.unscale_(opt);
      grad::clip_grad_norm_(params, 5.0);
    }
    trace.stepped.push_back(scaler.step(opt));
    scaler.update();
    trace.scales.push_back(scaler.get_scale());
    trace.trackers.push_back(scaler.get_growth_tracker());
  }
  return trace;
}

}  // namespace

TEST_CASE("GradScaler on the test device: the scale, the skipped step and the parameters equal the CPU's",
          "[testdev][amp][scaler]") {
  using namespace trainkit::optim;
  struct Variant {
    std::string name;
    MakeOptimizer make_cpu, make_dev;
    bool unscale_first;
    Match match;
  };
  const MakeOptimizer torch_sgd = [](const std::vector<at::Tensor>& p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.01).momentum(0.9));
  };
  const std::vector<Variant> variants{
      {"torch::optim::SGD, unscale_ and clip", torch_sgd, torch_sgd, true, Match::kClose},
      {"trainkit Adam (foreach): unscaled by the scaler",
       maker<Adam>(AdamOptions(1e-2).foreach(true)), maker<Adam>(AdamOptions(1e-2)), false, Match::kBitwise},
      {"trainkit Adam, ATen's fused kernel: scale and found-inf handed to the kernel",
       maker<Adam>(AdamOptions(1e-2).aten_fused(true)), maker<Adam>(AdamOptions(1e-2).fused(true)), false,
       Match::kBitwise},
      {"trainkit SGD, ATen's fused kernel, after unscale_",
       maker<Sgd>(SgdOptions(0.01).momentum(0.9).aten_fused(true)),
       maker<Sgd>(SgdOptions(0.01).momentum(0.9).fused(true)), true, Match::kClose},
  };
  for (const auto& v : variants) {
    DYNAMIC_SECTION(v.name) {
      auto pc = make_params(torch::kCPU);
      auto pd = make_params(test_device());
      OptimizerPtr oc = v.make_cpu(pc);
      OptimizerPtr od = v.make_dev(pd);
      const auto options = amp::GradScalerOptions().init_scale(1024.0).growth_interval(2);
      amp::GradScaler sc(torch::kCPU, options);
      amp::GradScaler sd(test_device(), options);
      const ScalerTrace tc = run_scaler(pc, *oc, sc, v.unscale_first);
      const ScalerTrace td = run_scaler(pd, *od, sd, v.unscale_first);
      CHECK(td.scales == tc.scales);
      CHECK(td.trackers == tc.trackers);
      CHECK(tc.scales == std::vector<double>{1024, 2048, 2048, 1024, 1024, 2048});
      if (v.name.find("ATen's fused kernel:") == std::string::npos) {
        CHECK(td.stepped == tc.stepped);  // (a fused kernel skips on the device; step() then returns true)
      }
      check_tensors(pc, pd, v.match, "parameter");
      // The scaler's state saved on the device loads into a CPU scaler.
      torch::serialize::OutputArchive out;
      sd.save(out);
      std::stringstream bytes;
      out.save_to(bytes);
      torch::serialize::InputArchive in;
      in.load_from(bytes);
      amp::GradScaler loaded(torch::kCPU, options);
      loaded.load(in);
      CHECK(loaded.get_scale() == sc.get_scale());
      CHECK(loaded.get_growth_tracker() == sc.get_growth_tracker());
    }
  }
}

TEST_CASE("Trainer with a GradScaler on the test device equals the CPU run", "[testdev][amp][train]") {
  auto loader = toy_loader(5);
  data::DeviceSource loader_dev(loader, test_device());
  const auto options = train::TrainerOptions().epochs(1).clip_grad_norm(1.0);
  TrainRun cpu(torch::kCPU, options);
  TrainRun dev(test_device(), options);
  const auto scaler_options = amp::GradScalerOptions().init_scale(256.0).growth_interval(3);
  cpu.trainer->set_grad_scaler(std::make_shared<amp::GradScaler>(torch::kCPU, scaler_options));
  dev.trainer->set_grad_scaler(std::make_shared<amp::GradScaler>(test_device(), scaler_options));
  cpu.trainer->fit(loader);
  dev.trainer->fit(loader_dev);
  CHECK(dev.trainer->grad_scaler()->get_scale() == cpu.trainer->grad_scaler()->get_scale());
  CHECK(cpu.trainer->grad_scaler()->get_scale() == 256.0 * 16);  // 12 clean steps
  check_logs(*cpu.log, *dev.log, Match::kClose);
  check_modules(*cpu.model, *dev.model, Match::kClose);
}

// -------------------------------------------------------------------------------------------------- EMA, SWA

TEST_CASE("ModelEma, AveragedModel and update_bn on the test device equal the CPU's bit for bit",
          "[testdev][train][ema][swa]") {
  std::vector<torch::nn::Sequential> models;
  for (const c10::Device device : {c10::Device(torch::kCPU), test_device()}) {
    torch::manual_seed(4);
    models.emplace_back(torch::nn::Linear(16, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                        torch::nn::Linear(8, 3));
    models.back()->to(device);
  }
  std::vector<train::ModelEma> emas;
  std::vector<train::AveragedModel> swas;
  std::vector<train::AveragedModel> ema_fns;
  for (auto& m : models) {
    emas.emplace_back(*m, train::ModelEmaOptions(0.9).use_warmup(true));
    swas.emplace_back(*m);
    ema_fns.emplace_back(*m, train::ema_avg_fn(0.8), /*use_buffers=*/true);
  }
  auto loader = toy_loader(3, 40);
  for (size_t k = 0; k < models.size(); ++k) {
    const c10::Device device = models[k]->parameters().front().device();
    torch::optim::SGD sgd(models[k]->parameters(), torch::optim::SGDOptions(0.1));
    loader.set_epoch(0);
    int64_t step = 0;
    while (auto b = loader.next()) {
      const data::Batch batch = b->to(device);
      sgd.zero_grad();
      torch::cross_entropy_loss(models[k]->forward(batch.input()), batch.target()).backward();
      sgd.step();
      ++step;
      emas[k].update(*models[k], step);
      swas[k].update_parameters(*models[k]);
      ema_fns[k].update_parameters(*models[k]);
    }
  }
  check_tensors(emas[0].values(), emas[1].values(), Match::kBitwise, "EMA tensor");
  check_tensors(swas[0].values(), swas[1].values(), Match::kBitwise, "SWA tensor");
  check_tensors(ema_fns[0].values(), ema_fns[1].values(), Match::kBitwise, "EMA-function tensor");
  CHECK(swas[1].n_averaged() == swas[0].n_averaged());
  check_modules(*models[0], *models[1], Match::kBitwise);  // BatchNorm's running statistics among them
  // update_bn recomputes the BatchNorm statistics of the averaged weights on each device.
  std::vector<std::vector<at::Tensor>> statistics;
  for (size_t k = 0; k < models.size(); ++k) {
    const c10::Device device = models[k]->parameters().front().device();
    train::ScopedWeights scoped(*models[k], swas[k].values());
    data::DeviceSource source(loader, device);
    train::update_bn(*models[k], [&](const data::Batch& b) { return models[k]->forward(b.input()); }, source);
    statistics.push_back({});
    for (const auto& b : models[k]->buffers()) {
      statistics.back().push_back(b.clone());
    }
  }
  check_tensors(statistics[0], statistics[1], Match::kBitwise, "BatchNorm statistic after update_bn");
}

TEST_CASE("Trainer with the EMA and SWA hooks on the test device equals the CPU run", "[testdev][train][ema][swa]") {
  auto loader = toy_loader(5);
  auto val = toy_loader(6, 40);
  data::DeviceSource loader_dev(loader, test_device());
  data::DeviceSource val_dev(val, test_device());
  const auto options = train::TrainerOptions().epochs(3).val_every_steps(10);
  TrainRun cpu(torch::kCPU, options);
  TrainRun dev(test_device(), options);
  std::vector<std::shared_ptr<train::EMAWeightAveraging>> emas;
  std::vector<std::shared_ptr<train::StochasticWeightAveraging>> swas;
  for (TrainRun* run : {&cpu, &dev}) {
    emas.push_back(
        std::make_shared<train::EMAWeightAveraging>(*run->model, train::ModelEmaOptions(0.9).use_warmup(true)));
    swas.push_back(std::make_shared<train::StochasticWeightAveraging>(
        *run->model, *run->optimizer, train::StochasticWeightAveragingOptions(2e-3).swa_start(1).anneal_epochs(1)));
    run->trainer->add_callback(emas.back());
    run->trainer->add_callback(swas.back());
  }
  cpu.trainer->fit(loader, &val);
  dev.trainer->fit(loader_dev, &val_dev);
  REQUIRE(swas[0]->averaged().n_averaged() == 2);
  CHECK(swas[1]->averaged().n_averaged() == 2);
  check_logs(*cpu.log, *dev.log, Match::kBitwise);  // the points carry val_ema/* and val_swa/* too
  check_modules(*cpu.model, *dev.model, Match::kBitwise);
  check_tensors(emas[0]->ema().values(), emas[1]->ema().values(), Match::kBitwise, "EMA tensor");
  check_tensors(swas[0]->averaged().values(), swas[1]->averaged().values(), Match::kBitwise, "SWA tensor");
  check_eval(emas[0]->evaluate(*cpu.trainer, val), emas[1]->evaluate(*dev.trainer, val_dev), Match::kBitwise);
}

// ---------------------------------------------------------------------------------------------- DeviceSource

TEST_CASE("DeviceSource on the test device: crop, flip, normalize and a transform equal the CPU's, resumed too",
          "[testdev][data]") {
  torch::manual_seed(8);
  const at::Tensor images = torch::randint(0, 256, {20, 3, 6, 6}, torch::kUInt8);
  const at::Tensor labels = torch::randint(0, 10, {20});
  data::TensorLoader loader(images, labels, data::TensorLoaderOptions().batch_size(6).seed(2));
  const auto options = data::DeviceTransformOptions()
                           .crop_padding(2)
                           .horizontal_flip(true)
                           .normalize({0.5, 0.4, 0.3}, {0.2, 0.25, 0.3})
                           .seed(11)
                           .transform([](data::Batch b, at::Generator& gen) {
                             // Noise drawn from the batch's CPU generator, moved to the batch's device.
                             const at::Tensor noise = torch::rand(b.input().sizes(), gen).to(b.input().device());
                             return data::Batch(b.input() + 0.01 * noise, b.target());
                           });
  data::DeviceSource on_cpu(loader, torch::kCPU, options);
  data::DeviceSource on_dev(loader, test_device(), options);
  for (const int64_t epoch : {0, 1}) {
    std::vector<data::Batch> cpu_batches;
    on_cpu.set_epoch(epoch);
    while (auto b = on_cpu.next()) {
      cpu_batches.push_back(*b);
    }
    on_dev.set_epoch(epoch);
    TransferCounter counter;
    size_t i = 0;
    while (auto b = on_dev.next()) {
      INFO("epoch " << epoch << " batch " << i);
      REQUIRE(i < cpu_batches.size());
      CHECK(b->input().device() == test_device());
      CHECK(b->target().device() == test_device());
      CHECK(same(cpu_batches[i].input(), b->input(), Match::kBitwise));
      CHECK(same(cpu_batches[i].target(), b->target(), Match::kBitwise));
      ++i;
    }
    CHECK(i == cpu_batches.size());
    // Resumed at batch 2 of the epoch: the batches it would have given.
    on_dev.set_epoch(epoch);
    on_dev.skip(2);
    auto b = on_dev.next();
    REQUIRE(b.has_value());
    CHECK(same(cpu_batches[2].input(), b->input(), Match::kBitwise));
  }
}

// ------------------------------------------------------------------------------------ activation checkpointing

namespace {

/// Linear → ReLU → Dropout → Linear → ReLU → Linear on `device`, float32.
torch::nn::Sequential checkpoint_net(c10::Device device, double dropout) {
  torch::manual_seed(12);
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Dropout(dropout),
                            torch::nn::Linear(16, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4));
  net->to(device);
  return net;
}

/// The output and gradients of one forward/backward, plain (`segments` 0) or checkpointed.
std::vector<at::Tensor> checkpoint_step(torch::nn::Sequential& net, int64_t segments) {
  const c10::Device device = net->parameters().front().device();
  torch::manual_seed(7);
  const at::Tensor x = torch::linspace(-1, 1, 6 * 8).reshape({6, 8}).to(device);
  const at::Tensor out = segments == 0 ? net->forward(x) : nn::checkpoint_sequential(net, segments, x);
  (out.pow(2).sum() + out.sum()).backward();
  std::vector<at::Tensor> r{out.detach()};
  for (const auto& p : net->parameters()) {
    r.push_back(p.grad().clone());
  }
  // What the generators draw next: checkpointing leaves them where the plain run does.
  r.push_back(torch::rand({4}, torch::TensorOptions().device(device)));
  return r;
}

}  // namespace

TEST_CASE("Activation checkpointing on the test device: gradients equal the plain model's and the CPU's",
          "[testdev][nn][checkpoint]") {
  SECTION("without dropout: equal to the CPU's bit for bit") {
    auto cpu = checkpoint_net(torch::kCPU, 0.0);
    auto dev = checkpoint_net(test_device(), 0.0);
    const auto rc = checkpoint_step(cpu, 3);
    const auto rd = checkpoint_step(dev, 3);
    check_tensors(rc, rd, Match::kBitwise, "output, gradient or next draw");
  }
  SECTION("with dropout: the recomputation draws the device generator's masks of the forward") {
    auto plain = checkpoint_net(test_device(), 0.4);
    auto ckpt = checkpoint_net(test_device(), 0.4);
    const auto rp = checkpoint_step(plain, 0);
    const auto rc = checkpoint_step(ckpt, 3);
    REQUIRE(rp.size() == rc.size());
    for (size_t i = 0; i < rp.size(); ++i) {
      INFO("output, gradient or next draw " << i);
      CHECK(torch::equal(rp[i].cpu(), rc[i].cpu()));
    }
  }
}

// ------------------------------------------------------------------------------------------------ TorchScript

TEST_CASE("A TorchScript model on the test device: forward and a Trainer run equal the CPU's",
          "[testdev][nn][torchscript]") {
  const auto& golden = trainkit::test::golden("torchscript.toml");
  const std::string file =
      trainkit::test::source_path("tests/golden/" + *golden["model"]["file"].value<std::string>());
  std::vector<nn::ScriptModule> models;
  std::vector<std::unique_ptr<torch::optim::SGD>> optimizers;
  std::vector<std::unique_ptr<train::Trainer>> trainers;
  for (const c10::Device device : {c10::Device(torch::kCPU), test_device()}) {
    models.emplace_back(nn::ScriptModuleImpl::load(file));
    models.back()->to(device);
    nn::ScriptModule model = models.back();
    optimizers.push_back(
        std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)));
    trainers.push_back(std::make_unique<train::Trainer>(
        model.ptr(), [model](const data::Batch& b) mutable { return model->forward({b.input()}); }, *optimizers.back(),
        train::TrainerOptions().epochs(2)));
  }
  // The script module's own tensors moved with the wrapper's.
  for (const auto& p : models[1]->script().named_parameters()) {
    CHECK(p.value.device() == test_device());
  }
  torch::manual_seed(5);
  const at::Tensor x = torch::rand({30, 1, 28, 28});
  const at::Tensor y = torch::randint(0, 10, {30});
  data::TensorLoader loader(x, y, data::TensorLoaderOptions().batch_size(10).seed(1));
  data::DeviceSource loader_dev(loader, test_device());
  models[0]->eval();
  models[1]->eval();
  CHECK(same(models[0]->forward({x}), models[1]->forward({x.to(test_device())}), Match::kBitwise));
  models[0]->train();
  models[1]->train();
  trainers[0]->fit(loader);
  trainers[1]->fit(loader_dev);
  check_modules(*models[0], *models[1], Match::kBitwise);
  check_eval(trainers[0]->evaluate(loader), trainers[1]->evaluate(loader_dev), Match::kBitwise);
}
