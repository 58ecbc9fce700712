#pragma once
// A test accelerator: LibTorch's PrivateUse1 device, registered as "testdev" with two devices
// (testdev:0, testdev:1), whose memory is host memory, linked into trainkit_tests and dist_worker. It makes
// the semantics of a GPU that the CPU cannot show checkable there:
// - Transfers. Every copy from the device to the host -- item(), a truth value, .cpu(), .to(kCPU), copy_
//   into a CPU tensor, and the ops whose result the host must read (aten::equal, and the ops whose output
//   shape depends on the data: nonzero, masked_select, unique, bincount) -- and every copy from the host to
//   the device is counted. Ops that stay on the device count nothing.
// - A generator per device. Random ops on a device tensor draw from that device's default generator (or the
//   one passed), never from the CPU's; each device's generator is seeded, saved and restored on its own.
// - Device-only code paths. A tensor reports is_cpu() == false, so code that picks a path by device (fused
//   or foreach kernels, collectives by backend, autocast by device type) takes its non-CPU path; a CPU
//   tensor mixed with a device tensor in one op fails as on a GPU.
// What it cannot model: streams and asynchrony (every op finishes before it returns, so a missing
// synchronization or a race between streams stays hidden), kernel fusion and the device's own rounding
// (ops run as the CPU kernels, so results equal the CPU's), memory limits, and a host pointer into device
// memory (data_ptr() is readable here, a crash on a GPU).
// Ops without a kernel of their own run through ATen's boxed CPU fallback (at::native::cpu_fallback): the
// inputs are copied to the CPU, the CPU kernel runs, the outputs are copied back. Those internal copies are
// not counted.

#include <cstdint>
#include <map>
#include <string>

#include <c10/core/Device.h>

namespace trainkit::test {

/// Registers "testdev" as LibTorch's PrivateUse1 backend, once; test_device() calls it. Until then the test
/// device does not exist, so a process that never uses it keeps CUDA as torch's accelerator: a registered
/// PrivateUse1 backend becomes at::getAccelerator(), which breaks CUDA autograd and pinned memory.
void register_test_device();

/// The test device `index` (0 or 1).
c10::Device test_device(int index = 0);

/// Transfers between the test device and the host.
struct Transfers {
  int64_t to_host = 0;    ///< copies to the host and values the host read (item, bool, equal, data-dependent shapes)
  int64_t to_device = 0;  ///< copies from the host to a test device
  int64_t bytes_to_host = 0;    ///< bytes of the device tensors copied to the host (copies only, not item())
  int64_t bytes_to_device = 0;  ///< bytes of the device tensors copied from the host
};

/// Transfers since the process started.
Transfers transfers();

/// The host reads since the process started, by what caused them ("copy to host", "aten::nonzero" ...).
std::map<std::string, int64_t> host_reads_by_cause();

/// Counts the transfers made while it lives.
class TransferCounter {
 public:
  TransferCounter();
  /// Copies to the host and host reads since construction (or the last reset).
  int64_t to_host() const;
  /// Copies to a test device since construction (or the last reset).
  int64_t to_device() const;
  /// Bytes copied to the host since construction (or the last reset): each copy counts the device tensor's bytes.
  int64_t bytes_to_host() const;
  /// Bytes copied to a test device since construction (or the last reset).
  int64_t bytes_to_device() const;
  /// Host reads by cause since construction (or the last reset), for failure messages.
  std::string causes() const;
  void reset();

 private:
  Transfers start_;
  std::map<std::string, int64_t> start_causes_;
};

}  // namespace trainkit::test
