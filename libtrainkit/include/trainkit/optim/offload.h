#pragma once
/// @file
/// Optimizer offload to the host (ZeRO-Offload, Ren et al. 2021, arXiv 2101.06840): the parameters stay on
/// the device, the optimizer state and the step live on the CPU, where trainkit's fused CPU kernels run.
///
///     trainkit::optim::OffloadOptimizer opt(model->parameters(), [](std::vector<at::Tensor> host) {
///       return std::make_unique<trainkit::optim::Adam>(host, trainkit::optim::AdamOptions(1e-3));
///     });
///     opt.zero_grad(); loss.backward(); opt.step();
///
/// Each parameter has a host master copy (float32 for bfloat16/float16 parameters, else the parameter's
/// dtype) and a host gradient buffer; the inner optimizer, made by the factory over the masters, keeps its
/// state on the CPU. One step:
///   1. every gradient is copied down once into its host buffer (non_blocking into pinned memory when the
///      device is CUDA; one stream synchronization for all of them) -- after backward, not per bucket during
///      it: LibTorch gives no hook that fires once per accumulation window, and a copy per micro-batch would
///      move each gradient byte several times;
///   2. the param groups' options (what a scheduler set on this object) are copied to the inner optimizer,
///      which steps the masters on the CPU;
///   3. every parameter that had a gradient is copied back up once (non_blocking from pinned memory on
///      CUDA; bfloat16/float16 masters are rounded to the parameter's dtype on the host first, so that only
///      the parameter's own bytes cross).
/// Nothing else crosses in a step. The masters are read from the device at the first step after
/// construction, load() or reload_parameters(), and at the first step of a tensor that took another's place
/// in the param groups: change the parameters between steps only through this optimizer, or call
/// reload_parameters(). The param groups may be replaced or added to (ZeroRedundancyOptimizer's resharding
/// puts an optimizer loaded from another rank's shard onto this rank's parameters): the next step makes the
/// host masters and the host optimizer's groups anew from them.
///
/// state() holds the inner optimizer's per-parameter state keyed by the device parameters (as every
/// optimizer keys it); save()/load() write and read the inner optimizer's format, so an archive loads into
/// the same optimizer without offload and back. Under ZeRO stages 1 and 2 the shard's optimizer is an
/// OffloadOptimizer: return one from ZeroRedundancyOptimizer's factory (offloaded() makes that factory).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

namespace trainkit::optim {

/// Makes the host optimizer over the masters: one param group of each group it is given, in order, each over
/// exactly the tensors given (a group given with options carries a clone of its options).
using HostOptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::optim::OptimizerParamGroup>)>;
/// The one-group form of HostOptimizerFactory.
using HostOptimizerListFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

/// Options of OffloadOptimizer.
struct OffloadOptions {
  /// Host buffers (masters, gradient buffers, staging) in pinned memory, so that the copies can be
  /// asynchronous: unset = when the parameters are on a CUDA device.
  TORCH_ARG(std::optional<bool>, pin_memory) = std::nullopt;
};

/// A torch::optim::Optimizer whose state and step live on the host while its parameters live on a device.
class OffloadOptimizer : public torch::optim::Optimizer {
 public:
  /// Over `groups` of device parameters (floating, dense, all on one device): makes the host masters and
  /// builds the inner optimizer with `factory` over them. std::invalid_argument naming the parameter (param
  /// group and index) that is sparse, not floating or on another device than the first, or naming what the
  /// factory's optimizer holds that is not the master it was given.
  OffloadOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups, const HostOptimizerFactory& factory,
                   OffloadOptions options = {});
  /// One param group of `params`.
  OffloadOptimizer(std::vector<at::Tensor> params, const HostOptimizerListFactory& factory,
                   OffloadOptions options = {});
  /// Frees the host buffers (the inner optimizer goes with them).
  ~OffloadOptimizer() override;

  /// Copies the gradients down, steps the inner optimizer on the host with this object's group options and
  /// copies the updated parameters up (`closure` runs first when given). Parameters without a gradient are
  /// neither moved nor stepped. std::invalid_argument naming a parameter with a sparse gradient.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// The inner optimizer's archive (its state and param groups, with this object's options; groups added
  /// since the last step included).
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads an archive of the inner optimizer's type (saved with or without offload; state saved on a device
  /// comes to the CPU); the groups' options become this object's. The masters are read from the device
  /// parameters at the next step.
  void load(torch::serialize::InputArchive& archive) override;

  /// Reads the masters from the device parameters at the next step (after the parameters were changed
  /// other than through this optimizer, e.g. loaded from a checkpoint).
  void reload_parameters();
  /// The host optimizer (its params are the masters; its per-parameter state lives in state() between steps).
  torch::optim::Optimizer& inner() { return *inner_; }
  /// The host master of parameter `index` of param group `group`.
  const at::Tensor& master(size_t group, size_t index) const;
  /// Host bytes of the masters, gradient buffers and staging buffers (the state not included).
  int64_t host_buffer_bytes() const;
  /// The device the parameters live on.
  c10::Device device() const { return device_; }

 private:
  struct Slot;
  struct Built;
  static Built build(std::vector<torch::optim::OptimizerParamGroup> groups, const HostOptimizerFactory& factory,
                     const OffloadOptions& options);
  OffloadOptimizer(Built built, OffloadOptions options);
  /// Moves this object's state into the inner optimizer (keyed by the masters) or back.
  void lend_state();
  void take_state();
  /// Brings the slots and the host optimizer's groups up to date with the param groups: a slot whose tensor
  /// changed is marked stale; replaced or added groups get slots of their own.
  void sync_slots();
  void forward_options() const;

  OffloadOptions options_;
  c10::Device device_;
  std::unique_ptr<torch::optim::Optimizer> inner_;
  std::vector<Slot> slots_;  // group by group
};

/// A HostOptimizerFactory-shaped factory for ZeroRedundancyOptimizer (or any code that builds an optimizer
/// over device param groups) that returns an OffloadOptimizer over them whose host optimizer `host` makes.
HostOptimizerFactory offloaded(HostOptimizerFactory host, OffloadOptions options = {});

}  // namespace trainkit::optim
