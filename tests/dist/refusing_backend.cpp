// The "refuse_cpu" device backend of dist_worker (see refusing_backend.h).
#include "dist/refusing_backend.h"

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "trainkit/dist/backend.h"

namespace trainkit::test::dist {

namespace {

std::atomic<int64_t> g_served{0};
std::atomic<int64_t> g_refused{0};

class RefusingBackend final : public c10d::Backend {
 public:
  explicit RefusingBackend(c10::intrusive_ptr<c10d::Backend> inner)
      : Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)) {}

  const std::string getBackendName() const override { return "refuse_cpu"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    auto host = serve("allreduce", tensors);
    return inner_->allreduce(host, opts);
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    auto host = serve("broadcast", tensors);
    return inner_->broadcast(host, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    auto host = serve("reduce", tensors);
    return inner_->reduce(host, opts);
  }

 private:
  /// CPU aliases of the device tensors (each keeps its tensor alive), or a throw for a CPU tensor.
  static std::vector<at::Tensor> serve(const char* what, const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> host;
    for (const auto& t : tensors) {
      if (t.is_cpu()) {
        ++g_refused;
        throw std::invalid_argument(std::string("refuse_cpu ") + what +
                                    ": Tensors must be CUDA and dense (a CPU tensor reached the device backend)");
      }
      host.push_back(at::from_blob(
          t.data_ptr(), t.sizes(), t.strides(), [keep = t](void*) {}, t.options().device(at::kCPU)));
    }
    ++g_served;
    return host;
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
};

}  // namespace

void register_refusing_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    trainkit::dist::register_backend("refuse_cpu", [](const trainkit::dist::BackendContext& context) {
      return c10::intrusive_ptr<c10d::Backend>(
          c10::make_intrusive<RefusingBackend>(trainkit::dist::make_gloo_backend(context)));
    });
  });
}

int64_t refusing_backend_served() { return g_served.load(); }

int64_t refusing_backend_refused() { return g_refused.load(); }

}  // namespace trainkit::test::dist
