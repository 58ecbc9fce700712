#include "trainkit/nn/activation_checkpoint.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include <ATen/Context.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include "detail/check.h"
#include "detail/rng_state.h"
#include "trainkit/compat.h"

namespace trainkit::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Autocast's per-thread state for one device type.
struct AutocastState {
  c10::DeviceType device = c10::kCPU;
  bool enabled = false;
  c10::ScalarType dtype = c10::kBFloat16;

  static AutocastState current(c10::DeviceType device) {
    return {device, compat::autocast_enabled(device), compat::autocast_dtype(device)};
  }
  void apply() const {
    compat::set_autocast_enabled(device, enabled);
    compat::set_autocast_dtype(device, dtype);
  }
};

/// Sets autocast (CPU and CUDA) to `states` and turns the cast cache off; restores all on destruction.
/// The cache is off because a weight cast cached while grad is disabled (the checkpointed forward) has no
/// graph: a later use of the cached cast with grad enabled would silently cut the weight's gradient.
class AutocastScope {
 public:
  explicit AutocastScope(const std::vector<AutocastState>& states) {
    for (const auto& s : states) {
      saved_.push_back(AutocastState::current(s.device));
      s.apply();
    }
    cache_ = compat::autocast_cache_enabled();
    compat::set_autocast_cache_enabled(false);
  }
  /// Keeps the current autocast state, turns the cache off.
  AutocastScope() : AutocastScope(std::vector<AutocastState>{}) {}
  ~AutocastScope() {
    compat::set_autocast_cache_enabled(cache_);
    for (const auto& s : saved_) {
      s.apply();
    }
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  std::vector<AutocastState> saved_;
  bool cache_ = true;
};

using trainkit::detail::rng_state;
using trainkit::detail::set_rng_state;

using RngStates = std::vector<std::pair<c10::Device, at::Tensor>>;

/// Sets the generators to `states`; puts back the states they had on destruction (PyTorch's fork_rng).
class RngFork {
 public:
  explicit RngFork(const RngStates& states) {
    for (const auto& [device, state] : states) {
      saved_.emplace_back(device, rng_state(device));
      set_rng_state(device, state);
    }
  }
  ~RngFork() {
    for (const auto& [device, state] : saved_) {
      set_rng_state(device, state);
    }
  }
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngStates saved_;
};

/// Copies of `buffers` now; written back on destruction.
class BufferRestore {
 public:
  explicit BufferRestore(const std::vector<at::Tensor>& buffers) : buffers_(buffers) {
    torch::NoGradGuard no_grad;
    for (const auto& b : buffers_) {
      copies_.push_back(b.defined() ? b.clone() : at::Tensor());
    }
  }
  ~BufferRestore() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers_.size(); ++i) {
      if (buffers_[i].defined()) {
        buffers_[i].copy_(copies_[i]);
      }
    }
  }
  BufferRestore(const BufferRestore&) = delete;
  BufferRestore& operator=(const BufferRestore&) = delete;

 private:
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> copies_;
};

/// What backward needs besides the saved inputs; travels in the autograd context as a capsule.
struct Segment : torch::CustomClassHolder {
  CheckpointFunction fn;
  size_t num_inputs = 0;
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> buffers;
  RngStates rng;
  std::vector<AutocastState> autocast;
};

struct CheckpointNode : torch::autograd::Function<CheckpointNode> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<Segment> segment, at::TensorList tensors) {
    const std::vector<at::Tensor> inputs(tensors.begin(), tensors.begin() + static_cast<int64_t>(segment->num_inputs));
    segment->autocast = {AutocastState::current(c10::kCPU), AutocastState::current(c10::kCUDA)};
    variable_list outputs;
    {
      AutocastScope no_cache;
      outputs = segment->fn(inputs);
    }
    std::vector<at::Tensor> non_differentiable;
    for (const auto& out : outputs) {
      TRAINKIT_CHECK_ARG(out.defined(), "checkpoint: the segment returned an undefined tensor");
      if (!at::isFloatingType(out.scalar_type()) && !at::isComplexType(out.scalar_type())) {
        non_differentiable.push_back(out);
      }
    }
    ctx->mark_non_differentiable(non_differentiable);
    ctx->save_for_backward(inputs);
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto segment = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data["segment"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    std::vector<at::Tensor> wrt;  // what gradients are asked for: inputs that require grad, then parameters
    std::vector<size_t> wrt_slot;  // their slot among the Function's inputs (slot 0 is the segment)
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor x = saved[i].defined() ? saved[i].detach() : saved[i];
      if (saved[i].defined() && saved[i].requires_grad()) {
        x.requires_grad_(true);
        wrt.push_back(x);
        wrt_slot.push_back(1 + i);
      }
      inputs.push_back(x);
    }
    for (size_t i = 0; i < segment->parameters.size(); ++i) {
      if (segment->parameters[i].requires_grad()) {
        wrt.push_back(segment->parameters[i]);
        wrt_slot.push_back(1 + segment->num_inputs + i);
      }
    }
    // Buffers are copied before the recomputation and written back only after the nested backward: the
    // recomputed graph saved them (batch_norm's backward reads running_mean/var), and writing them earlier
    // would bump their version and fail its check.
    BufferRestore buffers(segment->buffers);
    variable_list outputs;
    {
      RngFork rng(segment->rng);
      AutocastScope autocast(segment->autocast);
      torch::AutoGradMode grad(true);
      outputs = segment->fn(inputs);
    }
    TRAINKIT_CHECK_ARG(outputs.size() == grad_outputs.size(),
                       "checkpoint: the recomputation returned {} tensors, the forward {}", outputs.size(),
                       grad_outputs.size());
    variable_list roots;
    variable_list root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    variable_list result(1 + segment->num_inputs + segment->parameters.size());
    if (roots.empty() || wrt.empty()) {
      return result;
    }
    // The nested backward captures the gradients of `wrt` without running their AccumulateGrad nodes;
    // returned here, they are accumulated once, by the outer backward's nodes (and their hooks).
    const variable_list grads = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false,
                                                      /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < grads.size(); ++k) {
      result[wrt_slot[k]] = grads[k];
    }
    return result;
  }
};

}  // namespace

CheckpointOptions checkpoint_options_for(const torch::nn::Module& module) {
  return CheckpointOptions().parameters(module.parameters()).buffers(module.buffers());
}

std::vector<at::Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options) {
  TRAINKIT_CHECK_ARG(static_cast<bool>(fn), "checkpoint: empty function");
  const auto needs_grad = [](const at::Tensor& t) { return t.defined() && t.requires_grad(); };
  const bool any_grad = std::any_of(inputs.begin(), inputs.end(), needs_grad) ||
                        std::any_of(options.parameters().begin(), options.parameters().end(), needs_grad);
  if (!torch::autograd::GradMode::is_enabled() || !any_grad) {
    return fn(inputs);  // no graph will be built: nothing to save, nothing to recompute
  }
  auto segment = c10::make_intrusive<Segment>();
  segment->fn = fn;
  segment->num_inputs = inputs.size();
  segment->parameters = options.parameters();
  segment->buffers = options.buffers();
  if (options.preserve_rng_state()) {
    segment->rng.emplace_back(c10::Device(c10::kCPU), rng_state(c10::Device(c10::kCPU)));
    for (const auto& x : inputs) {
      // Every accelerator's generator, not only CUDA's (PyTorch stashes the inputs' device type's states).
      if (x.defined() && !x.is_cpu() && !x.is_meta()) {
        const c10::Device device = x.device();
        const bool seen = std::any_of(segment->rng.begin(), segment->rng.end(),
                                      [&](const auto& s) { return s.first == device; });
        if (!seen) {
          segment->rng.emplace_back(device, rng_state(device));
        }
      }
    }
  }
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), options.parameters().begin(), options.parameters().end());
  return CheckpointNode::apply(segment, at::TensorList(all));
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const CheckpointOptions& options) {
  TRAINKIT_CHECK_ARG(static_cast<bool>(fn), "checkpoint: empty function");
  return checkpoint([fn](const std::vector<at::Tensor>& xs) { return std::vector<at::Tensor>{fn(xs[0])}; },
                    std::vector<at::Tensor>{input}, options)[0];
}

at::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments, const at::Tensor& input,
                                 bool preserve_rng_state) {
  torch::nn::Sequential seq = sequential;  // a handle: the same modules
  const auto n = static_cast<int64_t>(seq->size());
  TRAINKIT_CHECK_ARG(segments >= 1 && segments <= n,
                     "checkpoint_sequential: segments must be in [1, {}] (the number of modules), got {}", n,
                     segments);
  const int64_t size = n / segments;
  const auto run = [impl = seq.ptr()](int64_t from, int64_t to, at::Tensor x) {
    for (int64_t i = from; i < to; ++i) {
      x = (impl->begin() + i)->forward(x);
    }
    return x;
  };
  at::Tensor x = input;
  int64_t start = 0;
  for (int64_t s = 0; s + 1 < segments; ++s) {
    const int64_t end = start + size;
    CheckpointOptions options;
    options.preserve_rng_state(preserve_rng_state);
    for (int64_t i = start; i < end; ++i) {
      const auto& module = *seq->ptr(static_cast<size_t>(i));
      auto params = module.parameters();
      auto buffers = module.buffers();
      options.parameters().insert(options.parameters().end(), params.begin(), params.end());
      options.buffers().insert(options.buffers().end(), buffers.begin(), buffers.end());
    }
    x = checkpoint([run, start, end](const at::Tensor& in) { return run(start, end, in); }, x, options);
    start = end;
  }
  return run(start, n, x);
}

}  // namespace trainkit::nn
