#include "trainkit/train/callbacks/profiler_trace.h"

#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include "detail/check.h"

namespace trainkit::train {
namespace {

namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

}  // namespace

ProfilerTrace::ProfilerTrace(ProfilerTraceOptions options) : options_(std::move(options)) {
  TRAINKIT_CHECK_ARG(!options_.path().empty(), "ProfilerTrace: the trace path must not be empty");
  TRAINKIT_CHECK_ARG(options_.wait() >= 0, "ProfilerTrace: invalid wait: {}", options_.wait());
  TRAINKIT_CHECK_ARG(options_.active() >= 1, "ProfilerTrace: invalid active: {}", options_.active());
}

ProfilerTrace::~ProfilerTrace() {
  if (active_) {
    try {
      kineto::disableProfiler();  // the trainer threw inside the window: stop recording, write nothing
    } catch (...) {
    }
  }
}

void ProfilerTrace::start() {
  TRAINKIT_CHECK_ARG(!torch::profiler::impl::profilerEnabled(),
                     "ProfilerTrace: another profiler is already running in this thread");
  const ProfilerConfig config(ProfilerState::KINETO, options_.record_shapes(), options_.profile_memory(),
                              options_.with_stack());
  std::set<ActivityType> activities{ActivityType::CPU};
  if (torch::cuda::is_available()) {
    activities.insert(ActivityType::CUDA);
  }
  kineto::prepareProfiler(config, activities);
  kineto::enableProfiler(config, activities);
  active_ = true;
}

void ProfilerTrace::stop_and_write() {
  active_ = false;
  const std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
  const std::filesystem::path path(options_.path());
  std::error_code ec;
  if (path.has_parent_path()) {
    std::filesystem::create_directories(path.parent_path(), ec);
  }
  std::filesystem::remove(path, ec);  // so that an old file cannot pass for the new trace
  result->save(options_.path());
  if (!std::filesystem::exists(path) || std::filesystem::file_size(path) == 0) {
    throw std::runtime_error(fmt::format("ProfilerTrace: {}: the trace could not be written", options_.path()));
  }
  written_ = true;
  spdlog::info("profiler: {} steps recorded to {} ({} events)", recorded_, options_.path(), result->events().size());
}

void ProfilerTrace::on_train_begin(Trainer&) {
  seen_ = 0;
  if (!written_ && options_.wait() == 0) {
    start();
  }
}

bool ProfilerTrace::on_step_end(Trainer&, const StepEvent&) {
  ++seen_;
  if (active_) {
    ++recorded_;
    if (recorded_ == options_.active()) {
      stop_and_write();
    }
  } else if (!written_ && seen_ == options_.wait()) {
    start();
  }
  return false;
}

void ProfilerTrace::on_train_end(Trainer&) {
  if (active_) {
    if (recorded_ > 0) {
      stop_and_write();
    } else {
      active_ = false;
      kineto::disableProfiler();
    }
  }
}

}  // namespace trainkit::train
