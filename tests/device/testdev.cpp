// The test accelerator (testdev.h): PrivateUse1's allocator, device guard, hooks and generators, the
// kernels that must not copy (views, resize, copies between devices, host reads) and the counting CPU
// fallback for every other op.
#include "device/testdev.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <torch/library.h>
#include <torch/torch.h>

namespace trainkit::test {
namespace {

constexpr c10::DeviceType kTestDevice = c10::DeviceType::PrivateUse1;
constexpr c10::DeviceIndex kTestDeviceCount = 2;

thread_local c10::DeviceIndex t_current_device = 0;
/// Depth of CPU fallbacks on this thread: the copies they make are not the program's transfers.
thread_local int t_fallback_depth = 0;

std::atomic<int64_t> g_to_host{0};
std::atomic<int64_t> g_to_device{0};
std::atomic<int64_t> g_bytes_to_host{0};
std::atomic<int64_t> g_bytes_to_device{0};
std::mutex g_causes_mutex;
std::map<std::string, int64_t>& causes_map() {
  static auto* causes = new std::map<std::string, int64_t>();  // never destroyed: counted until exit
  return *causes;
}

void count_host_read(const std::string& cause) {
  if (t_fallback_depth > 0) {
    return;
  }
  ++g_to_host;
  std::lock_guard<std::mutex> lock(g_causes_mutex);
  ++causes_map()[cause];
}

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kTestDeviceCount, "testdev: no device ", static_cast<int>(index), " (there are ",
              static_cast<int>(kTestDeviceCount), ")");
}

// ---- memory ----

void free_device_block(void* ptr) { std::free(ptr); }

class TestDeviceAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    void* ptr = nullptr;
    if (bytes > 0) {
      ptr = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
      TORCH_CHECK(ptr != nullptr, "testdev: out of memory allocating ", bytes, " bytes");
    }
    return {ptr, ptr, &free_device_block, c10::Device(kTestDevice, t_current_device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_device_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

TestDeviceAllocator g_allocator;

// ---- device guard: one stream per device, which finishes every op before it returns ----

class TestDeviceGuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  TestDeviceGuardImpl() = default;
  explicit TestDeviceGuardImpl(c10::DeviceType type) { TORCH_INTERNAL_ASSERT(type == kTestDevice); }
  c10::DeviceType type() const override { return kTestDevice; }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device old = getDevice();
    setDevice(device);
    return old;
  }
  c10::Device getDevice() const override { return {kTestDevice, t_current_device}; }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kTestDevice, "testdev: not a test device: ", device);
    if (device.has_index()) {
      check_index(device.index());
      t_current_device = device.index();
    }
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.has_index()) {
      t_current_device = device.index();
    }
  }
  c10::Stream getStream(c10::Device device) const override { return c10::Stream(c10::Stream::DEFAULT, device); }
  c10::Stream getDefaultStream(c10::Device device) const override { return c10::Stream(c10::Stream::DEFAULT, device); }
  c10::Stream exchangeStream(c10::Stream stream) const override { return c10::Stream(c10::Stream::DEFAULT, stream.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return kTestDeviceCount; }
  // Every op has finished when it returns: events are always reached, synchronizing waits for nothing.
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TestDeviceGuardImpl);

// ---- generators: one per device, drawing with the CPU's algorithm from a state of its own ----

class TestDeviceGenerator final : public c10::GeneratorImpl {
 public:
  explicit TestDeviceGenerator(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(kTestDevice, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        engine_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  static c10::DeviceType device_type() { return kTestDevice; }
  /// The CPU generator the device's random ops draw from.
  const at::Generator& engine() const { return engine_; }

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(engine_.mutex());
    engine_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override { engine_.set_offset(offset); }
  uint64_t get_offset() const override { return engine_.get_offset(); }
  uint64_t current_seed() const override { return engine_.current_seed(); }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(engine_.mutex());
    return engine_.seed();
  }
  void set_state(const c10::TensorImpl& state) override {
    std::lock_guard<std::mutex> lock(engine_.mutex());
    engine_.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> lock(engine_.mutex());
    return engine_.unsafeGetGeneratorImpl()->get_state();
  }

 private:
  TestDeviceGenerator* clone_impl() const override {
    auto* copy = new TestDeviceGenerator(device().index());
    copy->engine_ = engine_.clone();
    return copy;
  }
  mutable at::Generator engine_;  // its mutex is taken in const get_state
};

const at::Generator& default_generator(c10::DeviceIndex index) {
  static const auto* generators = [] {
    auto* gens = new std::vector<at::Generator>();  // never destroyed, as CUDA's default generators
    for (c10::DeviceIndex i = 0; i < kTestDeviceCount; ++i) {
      gens->push_back(at::make_generator<TestDeviceGenerator>(i));
    }
    return gens;
  }();
  check_index(index);
  return (*generators)[static_cast<size_t>(index)];
}

class TestDeviceHooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index < 0 ? t_current_device : index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<TestDeviceGenerator>(index < 0 ? t_current_device : index);
  }
  at::Device getDeviceFromPtr(void*) const override { return {kTestDevice, t_current_device}; }
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return at::getCPUAllocator(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return kTestDeviceCount; }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    check_index(index);
    t_current_device = index;
  }
  c10::DeviceIndex getCurrentDevice() const override { return t_current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const c10::DeviceIndex old = t_current_device;
    setCurrentDevice(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    TORCH_CHECK(storage.resizable(), "testdev: the storage is not resizable");
    c10::DataPtr grown = g_allocator.allocate(bytes);
    if (storage.nbytes() > 0 && bytes > 0) {
      std::memcpy(grown.get(), storage.data(), std::min(bytes, storage.nbytes()));
    }
    storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(grown));
    storage.unsafeGetStorageImpl()->set_nbytes(bytes);
  }
};

// ---- kernels ----

/// A CPU tensor over the same memory as the test-device tensor `t` (a CPU tensor is returned as it is).
at::Tensor host_alias(const at::Tensor& t) {
  if (t.device().type() != kTestDevice) {
    return t;
  }
  if (t.numel() == 0) {
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kCPU));
  }
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(c10::kCPU));
}

std::optional<c10::DeviceGuard> guard_for(std::optional<c10::Device> device) {
  if (device && device->has_index()) {
    return std::optional<c10::DeviceGuard>(std::in_place, *device);
  }
  return std::nullopt;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool>, std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout || *layout == c10::kStrided, "testdev: only strided tensors");
  const auto guard = guard_for(device);
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device, std::optional<bool>) {
  TORCH_CHECK(!layout || *layout == c10::kStrided, "testdev: only strided tensors");
  const auto guard = guard_for(device);
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

/// Copies between the host and a test device, or between test devices (at::native::copy_ sends every copy
/// that involves a PrivateUse1 tensor here).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  const bool from_device = self.device().type() == kTestDevice;
  const bool to_device = dst.device().type() == kTestDevice;
  if (from_device && !to_device) {
    count_host_read("copy to host");
    if (t_fallback_depth == 0) g_bytes_to_host += static_cast<int64_t>(self.nbytes());
  } else if (!from_device && to_device && t_fallback_depth == 0) {
    ++g_to_device;
    g_bytes_to_device += static_cast<int64_t>(dst.nbytes());
  }
  if (dst.numel() > 0) {
    host_alias(dst).copy_(host_alias(self));
  }
  return dst;
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  const size_t bytes = static_cast<size_t>(impl->storage_offset() + impl->numel()) * self.itemsize();
  if (impl->numel() > 0 && bytes > impl->storage().nbytes()) {
    at::detail::getPrivateUse1Hooks().resizePrivateUse1Bytes(impl->storage(), bytes);
  }
  if (memory_format) {
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  count_host_read("aten::_local_scalar_dense");
  return at::_local_scalar_dense(host_alias(self));
}

/// native_dropout as its CPU kernel computes it, with the mask drawn on the device (at::dropout calls it for
/// accelerator tensors only; the CPU kernel would draw from the CPU generator).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0 || !train.value_or(true) || p == 0) {
    return {input.clone(), at::ones_like(input, input.options().dtype(c10::kBool))};
  }
  const double keep = 1.0 - p;
  const double scale = keep == 0 ? 0.0 : 1.0 / keep;
  at::Tensor mask = at::empty_like(input).bernoulli_(keep);
  at::Tensor output = input.mul(mask).mul_(scale);
  return {output, mask.to(c10::kBool)};
}

/// native_batch_norm's CPU kernel on the device's memory. The op updates running_mean and running_var in place
/// although its schema does not mark them as written, so the boxed fallback would update its CPU copies of
/// them and drop those: a model's BatchNorm statistics would never move on the device. Here the kernel reads
/// and writes host aliases of the device tensors, as a GPU kernel updates its own; the outputs are copied to
/// the device (internal copies, not counted).
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(const at::Tensor& input,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias,
                                                                 const std::optional<at::Tensor>& running_mean,
                                                                 const std::optional<at::Tensor>& running_var,
                                                                 bool training, double momentum, double eps) {
  const auto host = [](const std::optional<at::Tensor>& t) -> std::optional<at::Tensor> {
    return t && t->defined() ? std::optional<at::Tensor>(host_alias(*t)) : t;
  };
  auto [out, save_mean, save_invstd] = at::native_batch_norm(host_alias(input), host(weight), host(bias),
                                                             host(running_mean), host(running_var), training,
                                                             momentum, eps);
  ++t_fallback_depth;
  const auto to_device = [&input](const at::Tensor& t) { return t.to(input.device()); };
  std::tuple<at::Tensor, at::Tensor, at::Tensor> result{to_device(out), to_device(save_mean), to_device(save_invstd)};
  --t_fallback_depth;
  return result;
}

/// Whether `from`'s data can replace `self`'s in place (Variable::set_data, which Module::to uses). TensorImpl's
/// own rule lists the dense backends that may trade data (CPU, CUDA ...), and PrivateUse1 is not among them;
/// the test device's tensors trade with the CPU's as CUDA's do.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  const auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() && (t.is_cpu() || t.device().type() == kTestDevice);
  };
  if (dense(self) && dense(from)) {
    return true;
  }
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

/// Ops whose result the host reads: a boolean, or an output whose shape depends on the data.
bool reads_on_host(const std::string& op) {
  static const std::set<std::string> ops = {
      "aten::equal", "aten::nonzero", "aten::masked_select", "aten::_unique", "aten::_unique2", "aten::unique_dim",
      "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::bincount", "aten::repeat_interleave"};
  return ops.count(op) > 0;
}

/// The test device an op runs on: its first test-device tensor's, else the current one.
c10::DeviceIndex op_device(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first) {
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == kTestDevice) {
      return v.toTensor().device().index();
    }
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) {
        if (t.defined() && t.device().type() == kTestDevice) {
          return t.device().index();
        }
      }
    }
  }
  return t_current_device;
}

/// Throws as CUDA does when a CPU tensor of one or more dimensions meets a test-device tensor in an op (a
/// 0-dimensional CPU tensor is a scalar; indices of aten::index may live on the host).
void check_same_device(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first) {
  static const std::set<std::string> host_indices = {"aten::index", "aten::index_put", "aten::index_put_",
                                                     "aten::_index_put_impl_"};
  if (host_indices.count(schema.name()) > 0) {
    return;
  }
  std::optional<c10::Device> device;
  bool host = false;
  const auto visit = [&](const at::Tensor& t) {
    if (!t.defined()) {
      return;
    }
    if (t.device().type() == kTestDevice) {
      device = t.device();
    } else if (t.device().is_cpu() && t.dim() > 0) {
      host = true;
    }
  };
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) {
      visit(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) {
        visit(t);
      }
    } else if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        if (t) {
          visit(*t);
        }
      }
    }
  }
  TORCH_CHECK(!(device && host), "Expected all tensors to be on the same device, but found at least two devices, ",
              *device, " and cpu! (in ", schema.name(), " on the test device)");
}

/// Every other op: the CPU kernel through ATen's boxed fallback, after counting what the host reads and
/// pointing the op's generator (none given: the device's default one) at the device generator's engine.
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  if (reads_on_host(schema.name())) {
    count_host_read(schema.name());
  }
  const size_t num_args = schema.arguments().size();
  const size_t first = stack->size() - num_args;
  check_same_device(schema, *stack, first);
  for (size_t i = 0; i < num_args; ++i) {
    c10::TypePtr type = schema.arguments()[i].type();
    if (auto optional = type->cast<c10::OptionalType>()) {
      type = optional->getElementType();
    }
    if (type->kind() != c10::TypeKind::GeneratorType) {
      continue;
    }
    c10::IValue& arg = (*stack)[first + i];
    if (arg.isNone()) {
      arg = default_generator(op_device(schema, *stack, first)).get<TestDeviceGenerator>()->engine();
    } else if (arg.toGenerator().device().type() == kTestDevice) {
      arg = arg.toGenerator().get<TestDeviceGenerator>()->engine();
    }
  }
  ++t_fallback_depth;
  try {
    at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
  } catch (...) {
    --t_fallback_depth;
    throw;
  }
  --t_fallback_depth;
}

TestDeviceHooks g_hooks;

}  // namespace

void register_test_device() {
  // Once, on first use: a registered PrivateUse1 backend becomes torch's accelerator (at::getAccelerator()),
  // after which autograd finds no stream for CUDA nodes (every CUDA backward fails an internal assert) and
  // pinned memory is asked of this device's hooks (pin_memory() pins nothing). A process that never uses the
  // test device -- each [cuda] case runs in one -- keeps CUDA as its accelerator.
  static const bool registered = [] {
    c10::register_privateuse1_backend("testdev");
    c10::SetAllocator(kTestDevice, &g_allocator);
    at::RegisterPrivateUse1HooksInterface(&g_hooks);
    return true;
  }();
  (void)registered;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("resize_", resize_);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("native_dropout", native_dropout);
  m.impl("native_batch_norm", native_batch_norm);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("set_.source_Storage_storage_offset", at::native::set_storage_cpu_);
}

// Composite-implicit ops run at the autograd key: the override goes there.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

c10::Device test_device(int index) {
  register_test_device();
  check_index(static_cast<c10::DeviceIndex>(index));
  return {kTestDevice, static_cast<c10::DeviceIndex>(index)};
}

Transfers transfers() {
  return {g_to_host.load(), g_to_device.load(), g_bytes_to_host.load(), g_bytes_to_device.load()};
}

std::map<std::string, int64_t> host_reads_by_cause() {
  std::lock_guard<std::mutex> lock(g_causes_mutex);
  return causes_map();
}

TransferCounter::TransferCounter() { reset(); }

void TransferCounter::reset() {
  start_ = transfers();
  start_causes_ = host_reads_by_cause();
}

int64_t TransferCounter::to_host() const { return transfers().to_host - start_.to_host; }

int64_t TransferCounter::to_device() const { return transfers().to_device - start_.to_device; }

int64_t TransferCounter::bytes_to_host() const { return transfers().bytes_to_host - start_.bytes_to_host; }

int64_t TransferCounter::bytes_to_device() const { return transfers().bytes_to_device - start_.bytes_to_device; }

std::string TransferCounter::causes() const {
  std::string out;
  for (const auto& [cause, n] : host_reads_by_cause()) {
    const auto it = start_causes_.find(cause);
    const int64_t since = n - (it == start_causes_.end() ? 0 : it->second);
    if (since > 0) {
      out += fmt::format("{}{} x{}", out.empty() ? "" : ", ", cause, since);
    }
  }
  return out.empty() ? "none" : out;
}

}  // namespace trainkit::test
