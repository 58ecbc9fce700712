#pragma once
/// @file
/// Records a window of training steps with LibTorch's profiler (Kineto) and writes a Chrome trace
/// (chrome://tracing, https://ui.perfetto.dev), as torch.profiler.profile(schedule=schedule(wait, active=...),
/// on_trace_ready=tensorboard_trace_handler) does in Python. The Trainer marks its phases as user scopes
/// (trainkit::data, trainkit::forward, trainkit::backward, trainkit::optimizer, trainkit::callbacks), so
/// the trace shows them above LibTorch's operators.

#include <cstdint>
#include <string>

#include <torch/arg.h>

#include "trainkit/options.h"
#include "trainkit/train/callback.h"

namespace trainkit::train {

/// Options of ProfilerTrace.
struct ProfilerTraceOptions {
  /// Where the trace goes (JSON).
  explicit ProfilerTraceOptions(std::string path) : path_(std::move(path)) {}
  /// The Chrome trace file written when the window closes.
  TORCH_ARG(std::string, path);
  /// Steps of this fit() to let pass before recording (the first steps allocate and warm caches).
  TORCH_ARG(int64_t, wait) = 5;
  /// Steps recorded (>= 1).
  TORCH_ARG(int64_t, active) = 3;
  /// Record operator input shapes.
  TORCH_ARG(bool, record_shapes) = false;
  /// Record tensor memory allocations and frees.
  TORCH_ARG(bool, profile_memory) = false;
  /// Record the C++ call stack of each operator.
  TORCH_ARG(bool, with_stack) = false;

 public:
  /// The options a config sets, by key, with their rules and help (`trainkit train`'s [profile]; the path is
  /// the run's, and the number of steps recorded is the config's trace_steps).
  static const OptionBinding<ProfilerTraceOptions>& binding() {
    static const auto b = OptionBinding<ProfilerTraceOptions>()
                              .bind(TRAINKIT_OPTION(wait), rule::integer(0),
                                    "Steps of the run to let pass before the trace starts")
                              .bind(TRAINKIT_OPTION(record_shapes), rule::boolean(),
                                    "Record operator input shapes in the trace");
    return b;
  }
};

/// A Trainer hook that profiles steps wait+1 .. wait+active of fit() (counted from where fit() starts, so
/// a resumed run records a window too) and writes the trace when the last of them ends, or when training
/// ends inside the window (then with fewer steps). CUDA kernels are recorded too when CUDA is available.
/// Throws std::runtime_error naming the file when the trace cannot be written, and std::invalid_argument
/// for bad options or when another profiler is already running.
class ProfilerTrace : public Callback {
 public:
  explicit ProfilerTrace(ProfilerTraceOptions options);
  ~ProfilerTrace() override;
  void on_train_begin(Trainer& trainer) override;
  bool on_step_end(Trainer& trainer, const StepEvent& event) override;
  void on_train_end(Trainer& trainer) override;

  /// Steps recorded into the written trace (0 until it is written).
  int64_t steps_recorded() const { return recorded_; }
  /// Whether the trace has been written.
  bool written() const { return written_; }

 private:
  void start();
  void stop_and_write();
  ProfilerTraceOptions options_;
  int64_t seen_ = 0;
  int64_t recorded_ = 0;
  bool active_ = false;
  bool written_ = false;
};

}  // namespace trainkit::train
