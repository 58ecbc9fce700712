#pragma once
/// @file
/// Backends of a process group, by device type, as PyTorch's `"cpu:gloo,cuda:nccl"`: every group has Gloo
/// for CPU tensors, and at most one device backend for the tensors of every other device type (NCCL for
/// CUDA, or one registered here, as Python's `torch.distributed.Backend.register_backend`).
///
///     // "nccl" == "cuda:nccl" == "cpu:gloo,cuda:nccl": Gloo for CPU tensors, NCCL for CUDA tensors.
///     auto spec = trainkit::dist::parse_backend("cpu:gloo,cuda:nccl");
///     trainkit::dist::register_backend("mine", [](const trainkit::dist::BackendContext& c) { ... });
///     // then InitOptions().backend("cuda:mine")
///
/// A factory returns a c10d::Backend; only the source that defines one needs c10d's headers (this header
/// declares c10d's types and does not define them).

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <c10/core/DeviceType.h>
#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace trainkit::dist {

/// What a backend string asks for. CPU tensors always go to Gloo; tensors of any other device type go to
/// `device_backend`.
struct BackendSpec {
  /// Backend of non-CPU tensors: "nccl", a registered name, or empty (a CPU-only group: a device tensor is
  /// then an error naming its device).
  std::string device_backend;
  /// The device type the string named for it (CUDA for "nccl"/"auto"); documentation and messages only:
  /// routing is by CPU or not.
  c10::DeviceType device_type = c10::DeviceType::CUDA;
};

/// Parses a backend string: "gloo" (CPU tensors only), "nccl" (Gloo for CPU tensors, NCCL for CUDA
/// tensors), "auto" ("nccl" when `cuda_available`, else "gloo"), or PyTorch's per-device list
/// "<device>:<backend>,..." where the CPU's backend is gloo and one other device type (cuda, or the
/// PrivateUse1 backend's registered name) has nccl or a name given to register_backend(); Gloo for CPU
/// is implied when the list does not name it. Throws DistError naming the bad part.
BackendSpec parse_backend(const std::string& backend, bool cuda_available);

/// What a factory gets to build one group's device backend.
struct BackendContext {
  /// The group's store, prefixed for this backend.
  c10::intrusive_ptr<c10d::Store> store;
  int64_t rank = 0;
  int64_t world_size = 1;
  /// The timeout of every collective.
  std::chrono::milliseconds timeout{0};
  /// Rank 0's address (loopback means: every rank on this machine).
  std::string master_addr;
};

/// Makes a device backend for one group.
using BackendFactory = std::function<c10::intrusive_ptr<c10d::Backend>(const BackendContext&)>;

/// Registers `factory` as device backend `name`, usable as "<device>:<name>" in InitOptions::backend
/// (PyTorch's `Backend.register_backend`). Throws DistError when `name` is empty, has a ':' or ',', or is
/// taken ("gloo", "nccl", "auto" or registered before).
void register_backend(const std::string& name, BackendFactory factory);

/// The Gloo backend trainkit makes for CPU tensors (loopback devices when `master_addr` is a loopback
/// address and GLOO_SOCKET_IFNAME is unset), for factories that wrap it.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const BackendContext& context);

}  // namespace trainkit::dist
