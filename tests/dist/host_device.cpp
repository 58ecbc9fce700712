// The "testdev" PrivateUse1 device of dist_worker (see host_device.h).
#include "dist/host_device.h"

#include <cstring>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

namespace trainkit::test::dist {

namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
constexpr c10::DeviceIndex kDevices = 2;

thread_local c10::DeviceIndex t_current = 0;

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    if (d.has_index()) t_current = d.index();
    return old;
  }
  c10::Device getDevice() const override { return {kType, t_current}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.index() >= 0 && d.index() < kDevices, "testdev: no device ", d.str());
    t_current = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_current = d.index(); }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return c10::Stream(c10::Stream::DEFAULT, s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return kDevices; }
  // Every op finishes before it returns: events have nothing to wait for.
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

void free_host(void* p) { c10::free_cpu(p); }

/// Host memory, tagged with the current device of the allocating thread.
struct Allocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = n > 0 ? c10::alloc_cpu(n) : nullptr;
    return {p, p, &free_host, c10::Device(kType, t_current)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_host; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

Allocator g_allocator;

/// A CPU tensor over the same memory.
at::Tensor as_cpu(const at::Tensor& t) {
  if (t.is_cpu()) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>,
                               std::optional<at::MemoryFormat> memory_format) {
  const c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  const c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  as_cpu(dst).copy_(as_cpu(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  at::native::resize_impl_cpu_(self.unsafeGetTensorImpl(), size, std::nullopt);
  if (memory_format) self.unsafeGetTensorImpl()->empty_tensor_restride(*memory_format);
  return self;
}

/// What ATen asks of a PrivateUse1 backend besides its kernels.
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  // A generator per device (torch::manual_seed seeds them all); random ops here run through the CPU fallback.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    static const at::Generator generators[kDevices] = {at::make_generator<at::CPUGeneratorImpl>(),
                                                       at::make_generator<at::CPUGeneratorImpl>()};
    return generators[d < 0 ? t_current : d];
  }
  c10::DeviceIndex deviceCount() const override { return kDevices; }
  c10::DeviceIndex getCurrentDevice() const override { return t_current; }
  void setCurrentDevice(c10::DeviceIndex d) const override { t_current = d; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    const auto old = t_current;
    t_current = d;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), bytes);
  }
};

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) { at::native::cpu_fallback(op, stack); }

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("resize_", resize_);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
}

// Module::to(device) moves a parameter by set_data, which asks this of the CPU tensor and the device one;
// ATen's rule knows the built-in dense backends only.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", [](const at::Tensor& self, const at::Tensor& from) {
    return self.layout() == at::kStrided && from.layout() == at::kStrided;
  });
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

c10::Device host_device(int index) {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::register_privateuse1_backend("testdev");
    c10::SetAllocator(kType, &g_allocator);
    static Hooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
  });
  TORCH_CHECK(index >= 0 && index < kDevices, "testdev: no device ", index);
  return {kType, static_cast<c10::DeviceIndex>(index)};
}

int current_host_device() { return t_current; }

}  // namespace trainkit::test::dist
