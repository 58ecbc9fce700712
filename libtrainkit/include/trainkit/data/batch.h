#pragma once
/// @file
/// One batch of training data: any number of input and target tensors, by position and optionally by
/// name (tokens + lengths, image + mask, ...), moved to a device in one call.
///
///   data::Batch b(images, labels);                    // one input, one target
///   b.add_input(lengths, "lengths");                  // a second, named input
///   model->forward(b.input(), b.input("lengths"));
///   auto on_gpu = b.to(torch::kCUDA, /*non_blocking=*/true);

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace trainkit::data {

/// Input and target tensors of one batch (or of one sample, before collation). Every tensor's first
/// dimension is the batch dimension; size() reads it from the first input.
class Batch {
 public:
  Batch() = default;
  /// One input and one target (a target may be undefined for unlabelled data).
  Batch(at::Tensor input, at::Tensor target);
  /// Several inputs and targets, unnamed.
  Batch(std::vector<at::Tensor> inputs, std::vector<at::Tensor> targets);

  /// Appends an input; `name` (optional, unique among inputs) lets forward functions find it by name.
  Batch& add_input(at::Tensor tensor, std::string name = "");
  /// Appends a target; `name` as for add_input.
  Batch& add_target(at::Tensor tensor, std::string name = "");

  /// Input `index` (0 = the first). Throws std::out_of_range naming the index and the count.
  const at::Tensor& input(size_t index = 0) const;
  /// The input called `name`. Throws std::out_of_range listing the names there are.
  const at::Tensor& input(const std::string& name) const;
  /// Target `index` (0 = the first). Throws std::out_of_range naming the index and the count.
  const at::Tensor& target(size_t index = 0) const;
  /// The target called `name`. Throws std::out_of_range listing the names there are.
  const at::Tensor& target(const std::string& name) const;
  /// Whether an input (target) of that name exists.
  bool has_input(const std::string& name) const;
  bool has_target(const std::string& name) const;

  /// All inputs, in order.
  const std::vector<at::Tensor>& inputs() const { return inputs_; }
  /// All targets, in order.
  const std::vector<at::Tensor>& targets() const { return targets_; }
  /// Names of the inputs ("" for unnamed ones), parallel to inputs().
  const std::vector<std::string>& input_names() const { return input_names_; }
  /// Names of the targets, parallel to targets().
  const std::vector<std::string>& target_names() const { return target_names_; }
  /// Samples in the batch: the first dimension of the first input (of the first target when there is
  /// no input; 0 when empty).
  int64_t size() const;

  /// The same batch with every tensor on `device` (a no-op copy for tensors already there).
  /// `non_blocking` overlaps the copy with host work when the source memory is pinned.
  Batch to(const c10::Device& device, bool non_blocking = false) const;
  /// The same batch in page-locked host memory (needs a CUDA runtime; throws otherwise).
  Batch pin_memory() const;
  /// Whether every defined tensor is in page-locked host memory.
  bool is_pinned() const;

 private:
  Batch map(const std::function<at::Tensor(const at::Tensor&)>& f) const;

  std::vector<at::Tensor> inputs_;
  std::vector<at::Tensor> targets_;
  std::vector<std::string> input_names_;
  std::vector<std::string> target_names_;
};

/// Collates samples (Batches whose tensors lack the batch dimension) by stacking each input and target
/// position. Throws std::invalid_argument naming the sample and the position whose shape or count
/// differs from sample 0's, or for an empty list.
Batch collate_stack(const std::vector<Batch>& samples);

}  // namespace trainkit::data
