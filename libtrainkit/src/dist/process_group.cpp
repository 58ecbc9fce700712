// The only translation unit that includes c10d's headers: it is built in
// the `trainkit_dist_c10d` object library, which gets neither trainkit's fmt/spdlog shim nor its PCH,
// because c10d's headers expect the fmt that ships inside LibTorch's include directory (see
// libtrainkit/CMakeLists.txt).
//
// Gloo's headers: the wheel ships c10d's headers but not Gloo's, and ProcessGroupGloo.hpp includes five of
// them. They come from Debian's libgloo-dev (an older Gloo than the one compiled into libtorch_cpu.so),
// which is safe for the narrow use made here: we only name `ProcessGroupGloo` (its constructor,
// `Options::create_default` or, before it existed, `createDefaultDevice`/`createDeviceForInterface`, and
// `createDeviceForHostname` are exported by libtorch_cpu.so) and `Options`;
// their layouts hold Gloo objects only behind std::shared_ptr/std::unique_ptr, so they do not depend on
// Gloo's version, and nothing of Gloo itself is compiled here or linked (no libgloo).
#include "trainkit/dist/process_group.h"
#include "trainkit/compat.h"
#include "trainkit/dist/backend.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef TRAINKIT_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <ATen/ATen.h>

namespace trainkit::dist {

namespace {

/// A socket listening on `addr`:`port` only (the interface of MASTER_ADDR, loopback by default), for rank
/// 0's TCPStore to take over: given just a port, TCPStore would listen on every interface, and anyone who
/// reaches the machine could read and write the rendezvous keys for the whole run.
int listen_on(const std::string& addr, int64_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    throw DistError("rank 0 cannot resolve MASTER_ADDR '" + addr + "' to listen on: " + ::gai_strerror(rc));
  }
  std::string last_error = "no address";
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as TCPStore: TIME_WAIT does not count
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      ::freeaddrinfo(found);
      return fd;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  throw DistError("rank 0 cannot host the TCPStore on port " + service + " of MASTER_ADDR " + addr + " (" +
                  last_error + "; port in use? choose another MASTER_PORT; MASTER_ADDR must be an address of this "
                  "machine)");
}

std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

int64_t env_int(const char* name, const char* value) {
  try {
    size_t used = 0;
    const long long v = std::stoll(value, &used);
    if (used == std::string(value).size()) {
      return v;
    }
  } catch (const std::exception&) {
  }
  throw DistError(std::string(name) + "='" + value + "' is not an integer");
}

bool is_loopback(const std::string& addr) { return addr == "127.0.0.1" || addr == "localhost" || addr == "::1"; }

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::MAX:
      return c10d::ReduceOp::MAX;
    case ReduceOp::MIN:
      return c10d::ReduceOp::MIN;
    default:
      return c10d::ReduceOp::SUM;  // AVG: Gloo has no AVG, the sum is divided after the wait
  }
}

/// The backends registered by register_backend(), by name. Never destroyed: a group held in a global may
/// be made or torn down after main() returns.
struct Registry {
  std::mutex mutex;
  std::map<std::string, BackendFactory> factories;
};

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

bool is_registered(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.factories.count(name) != 0;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

}  // namespace

BackendSpec parse_backend(const std::string& backend, bool cuda_available) {
  BackendSpec spec;
  if (backend == "gloo") return spec;
  if (backend == "nccl" || (backend == "auto" && cuda_available)) {
    spec.device_backend = "nccl";
    return spec;
  }
  if (backend == "auto") return spec;
  if (backend.find(':') == std::string::npos) {
    throw DistError("unknown distributed backend '" + backend +
                    "' (gloo, nccl, auto, or per device type as \"cpu:gloo,cuda:nccl\")");
  }
  bool device_named = false;
  for (size_t start = 0, comma = 0; comma != std::string::npos; start = comma + 1) {
    comma = backend.find(',', start);
    const std::string part = trim(backend.substr(start, comma == std::string::npos ? comma : comma - start));
    const auto colon = part.find(':');
    const std::string where = "distributed backend '" + backend + "': '" + part + "'";
    if (colon == std::string::npos || colon == 0 || colon + 1 == part.size()) {
      throw DistError(where + " is not <device>:<backend> (e.g. cpu:gloo or cuda:nccl)");
    }
    const std::string device = part.substr(0, colon);
    const std::string name = part.substr(colon + 1);
    c10::DeviceType type = c10::DeviceType::CPU;
    try {
      type = c10::Device(device).type();
    } catch (const std::exception&) {
      throw DistError(where + " names no device type ('" + device + "': cpu, cuda, or the PrivateUse1 backend's name)");
    }
    if (type == c10::DeviceType::CPU) {
      if (name != "gloo") {
        throw DistError(where + ": CPU tensors go to gloo" +
                        (name == "nccl" ? std::string(" (NCCL cannot carry CPU tensors)") : std::string()));
      }
      continue;
    }
    if (device_named) {
      throw DistError(where + ": a group has one device backend, and '" + spec.device_backend + "' for " +
                      c10::DeviceTypeName(spec.device_type, true) + " came first");
    }
    if (name == "nccl") {
      if (type != c10::DeviceType::CUDA) throw DistError(where + ": NCCL carries CUDA tensors only");
    } else if (!is_registered(name)) {
      throw DistError(where + ": unknown backend '" + name + "' (nccl, or a name given to register_backend)");
    }
    spec.device_backend = name;
    spec.device_type = type;
    device_named = true;
  }
  return spec;
}

void register_backend(const std::string& name, BackendFactory factory) {
  if (name.empty() || name.find_first_of(":, ") != std::string::npos) {
    throw DistError("register_backend: '" + name + "' is not a backend name (empty, or has ':', ',' or a space)");
  }
  if (name == "gloo" || name == "nccl" || name == "auto") {
    throw DistError("register_backend: '" + name + "' is a built-in backend");
  }
  if (!factory) throw DistError("register_backend: the factory of '" + name + "' is empty");
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.factories.emplace(name, std::move(factory)).second) {
    throw DistError("register_backend: '" + name + "' is registered already");
  }
}

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const BackendContext& context) {
  auto gloo_options = compat::gloo_default_options<c10d::ProcessGroupGloo>(context.timeout);
  if (is_loopback(context.master_addr) && std::getenv("GLOO_SOCKET_IFNAME") == nullptr) {
    // All ranks on this machine: talk over loopback whatever the host name resolves to.
    gloo_options->devices = {c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")};
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(context.store, static_cast<int>(context.rank),
                                                     static_cast<int>(context.world_size), gloo_options);
}

InitOptions options_from_env() {
  InitOptions options;
  const char* rank = env("RANK");
  const char* world = env("WORLD_SIZE");
  if (rank == nullptr && world == nullptr) {
    return options;  // not launched by torchrun or `trainkit launch`: one process
  }
  if (world == nullptr) {
    throw DistError(std::string("RANK=") + rank + " is set but WORLD_SIZE is not (launch with `trainkit launch` or torchrun)");
  }
  if (rank == nullptr) {
    throw DistError(std::string("WORLD_SIZE=") + world + " is set but RANK is not (launch with `trainkit launch` or torchrun)");
  }
  options.world_size(env_int("WORLD_SIZE", world)).rank(env_int("RANK", rank));
  if (const char* local = env("LOCAL_RANK")) {
    options.local_rank(env_int("LOCAL_RANK", local));
  } else {
    options.local_rank(options.rank());
  }
  if (options.world_size() > 1) {
    const char* addr = env("MASTER_ADDR");
    const char* port = env("MASTER_PORT");
    if (addr == nullptr) throw DistError("MASTER_ADDR is not set (the address of rank 0)");
    if (port == nullptr) throw DistError("MASTER_PORT is not set (a free port on rank 0's machine)");
    options.master_addr(addr).master_port(env_int("MASTER_PORT", port));
  }
  if (const char* timeout = env("TRAINKIT_DIST_TIMEOUT")) {
    double seconds = 0;
    try {
      seconds = std::stod(timeout);
    } catch (const std::exception&) {
      seconds = -1;
    }
    if (!(seconds > 0)) throw DistError(std::string("TRAINKIT_DIST_TIMEOUT='") + timeout + "' is not a positive number of seconds");
    options.timeout(std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000))));
  }
  if (const char* backend = env("TRAINKIT_DIST_BACKEND")) {
    options.backend(backend);
  }
  return options;
}

struct Work::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  std::string what;
  std::vector<at::Tensor> divide;  // AVG: divided by `world` after the sum
  int64_t world = 1;
  std::string timeout;  // for the error message, e.g. "30 s"
  bool done = false;
};

void Work::wait() {
  if (!impl_ || impl_->done) {
    return;
  }
  impl_->done = true;
  try {
    impl_->work->wait();
  } catch (const std::exception& e) {
    throw DistError(impl_->what + " failed (a peer exited, lost its connection, or did not join within the " +
                    impl_->timeout + " timeout): " + error_text(e));
  }
  for (auto& t : impl_->divide) {
    t.div_(static_cast<double>(impl_->world));
  }
}

bool Work::completed() const { return !impl_ || impl_->done || impl_->work->isCompleted(); }

struct ProcessGroup::Impl {
  std::atomic<int64_t> all_reduces{0};
  std::atomic<int64_t> all_reduce_bytes{0};
  std::atomic<int64_t> broadcasts{0};
  std::atomic<int64_t> broadcast_bytes{0};
  std::atomic<int64_t> reduces{0};
  std::atomic<int64_t> reduce_bytes{0};
  c10::intrusive_ptr<c10d::Store> store;
  /// CPU tensors, in every group.
  c10::intrusive_ptr<c10d::Backend> gloo;
  /// Tensors of every other device type (NCCL for CUDA, or a registered backend); null in a CPU-only group.
  c10::intrusive_ptr<c10d::Backend> device;
  BackendSpec spec;

  c10d::Backend& backend_for(const at::Tensor& t, const char* what) {
    if (t.is_cpu()) {
      return *gloo;
    }
    if (!device) {
      throw std::invalid_argument(std::string(what) + ": " + t.device().str() +
                                  " tensor but this group has Gloo only, for CPU tensors (backend=\"nccl\", "
                                  "\"auto\" with a GPU, or \"<device>:<backend>\")");
    }
    return *device;
  }
};

ProcessGroup::ProcessGroup(InitOptions options) : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}
ProcessGroup::~ProcessGroup() = default;

std::shared_ptr<ProcessGroup> ProcessGroup::from_env() { return init(options_from_env()); }

std::shared_ptr<ProcessGroup> ProcessGroup::init(const InitOptions& options) {
  if (options.world_size() < 1) throw DistError("WORLD_SIZE=" + std::to_string(options.world_size()) + " must be >= 1");
  if (options.rank() < 0 || options.rank() >= options.world_size()) {
    throw DistError("RANK=" + std::to_string(options.rank()) + " is not in [0, WORLD_SIZE=" +
                    std::to_string(options.world_size()) + ")");
  }
  if (options.master_port() < 1 || options.master_port() > 65535) {
    throw DistError("MASTER_PORT=" + std::to_string(options.master_port()) + " is not in 1..65535");
  }
  if (options.timeout().count() <= 0) throw DistError("the distributed timeout must be > 0");
  const std::string& backend = options.backend();
  const BackendSpec spec = parse_backend(backend, at::hasCUDA());
#ifndef TRAINKIT_WITH_NCCL
  if (spec.device_backend == "nccl") {
    throw DistError("backend '" + backend + "' needs NCCL, which this LibTorch (built without CUDA) has not");
  }
#endif
  std::shared_ptr<ProcessGroup> group(new ProcessGroup(options));
  group->impl_->spec = spec;
  if (options.world_size() == 1) {
    return group;  // no store, no backend: collectives are no-ops
  }

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(options.master_port());
  store_options.isServer = options.rank() == 0;
  store_options.numWorkers = static_cast<size_t>(options.world_size());
  store_options.waitWorkers = true;
  store_options.timeout = options.timeout();
  if (options.rank() == 0) {
    store_options.masterListenFd = listen_on(options.master_addr(), options.master_port());
  }
  const std::string where = options.master_addr() + ":" + std::to_string(options.master_port());
  try {
    group->impl_->store = c10::make_intrusive<c10d::TCPStore>(options.master_addr(), store_options);
  } catch (const std::exception& e) {
    if (options.rank() == 0) {
      throw DistError("rank 0 cannot host the TCPStore on port " + std::to_string(options.master_port()) +
                      " (port in use? choose another MASTER_PORT) or not all " + std::to_string(options.world_size()) +
                      " ranks joined within the timeout: " + error_text(e));
    }
    throw DistError("rank " + std::to_string(options.rank()) + " cannot reach rank 0's TCPStore at " + where +
                    " within the timeout (is rank 0 running? are MASTER_ADDR/MASTER_PORT right?): " + error_text(e));
  }

  const int rank = static_cast<int>(options.rank());
  const int size = static_cast<int>(options.world_size());
  const auto context = [&](const char* prefix) {
    BackendContext c;
    c.store = c10::make_intrusive<c10d::PrefixStore>(prefix, group->impl_->store);
    c.rank = rank;
    c.world_size = size;
    c.timeout = options.timeout();
    c.master_addr = options.master_addr();
    return c;
  };
  try {
    // Gloo in every group: the CPU-side collectives (barrier, the scalar helpers, CPU buffers) need it
    // whatever carries the device's tensors, as in PyTorch's "cpu:gloo,cuda:nccl".
    group->impl_->gloo = make_gloo_backend(context("gloo"));
    if (spec.device_backend == "nccl") {
#ifdef TRAINKIT_WITH_NCCL
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = options.timeout();
      group->impl_->device = c10::make_intrusive<c10d::ProcessGroupNCCL>(context("nccl").store, rank, size, nccl_options);
#endif
    } else if (!spec.device_backend.empty()) {
      BackendFactory factory;
      {
        auto& r = registry();
        std::lock_guard<std::mutex> lock(r.mutex);
        factory = r.factories.at(spec.device_backend);
      }
      group->impl_->device = factory(context(spec.device_backend.c_str()));
      if (!group->impl_->device) {
        throw DistError("the factory of backend '" + spec.device_backend + "' returned no backend");
      }
    }
  } catch (const DistError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistError("rank " + std::to_string(rank) + " could not connect the " + backend + " backend: " + error_text(e));
  }
  return group;
}

namespace {
std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out << static_cast<double>(ms.count()) / 1000.0 << " s";
  return out.str();
}
}  // namespace

std::string ProcessGroup::backend_name(const c10::Device& device) const {
  if (world_size() == 1) return "none";
  if (device.is_cpu()) return "gloo";
  return impl_->device ? impl_->spec.device_backend : "(none for " + device.str() + ")";
}

Work ProcessGroup::all_reduce(at::Tensor tensor, ReduceOp op) {
  if (world_size() == 1) {
    return {};
  }
  if (!tensor.is_contiguous()) {
    throw std::invalid_argument("all_reduce: the tensor must be contiguous");
  }
  auto impl = std::make_shared<Work::Impl>();
  impl->what = "all_reduce of " + std::to_string(tensor.numel()) + " elements on rank " + std::to_string(rank());
  impl->timeout = seconds_text(options_.timeout());
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  opts.timeout = options_.timeout();
  if (op == ReduceOp::AVG) {
    impl->divide = {tensor};
    impl->world = world_size();
  }
  // c10d takes one tensor per local device: a list would be summed locally too.
  std::vector<at::Tensor> tensors{tensor};
  impl_->all_reduces += 1;
  impl_->all_reduce_bytes += static_cast<int64_t>(tensor.nbytes());
  try {
    impl->work = impl_->backend_for(tensor, "all_reduce").allreduce(tensors, opts);
  } catch (const std::exception& e) {
    throw DistError(impl->what + " could not start: " + error_text(e));
  }
  return Work(std::move(impl));
}

namespace {

/// Starts a rooted collective (reduce, broadcast) of one contiguous tensor after checking root and layout,
/// counting it in `count`/`bytes`; `what` names it in errors.
template <class Start>
Work start_rooted(const char* name, const at::Tensor& tensor, int64_t root, int64_t world, std::string what,
                  std::string timeout, std::atomic<int64_t>& count, std::atomic<int64_t>& bytes, const Start& start) {
  if (root < 0 || root >= world) {
    throw std::invalid_argument(std::string(name) + ": root " + std::to_string(root) + " not in [0, " +
                                std::to_string(world) + ")");
  }
  if (!tensor.is_contiguous()) {
    throw std::invalid_argument(std::string(name) + ": the tensor must be contiguous");
  }
  auto impl = std::make_shared<Work::Impl>();
  impl->what = std::move(what);
  impl->timeout = std::move(timeout);
  std::vector<at::Tensor> tensors{tensor};
  count += 1;
  bytes += static_cast<int64_t>(tensor.nbytes());
  try {
    impl->work = start(tensors);
  } catch (const std::exception& e) {
    throw DistError(impl->what + " could not start: " + error_text(e));
  }
  return Work(std::move(impl));
}

}  // namespace

Work ProcessGroup::reduce(at::Tensor tensor, int64_t root) {
  if (world_size() == 1) {
    return {};
  }
  c10d::ReduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.rootRank = root;
  opts.timeout = options_.timeout();
  return start_rooted("reduce", tensor, root, world_size(),
                      "reduce of " + std::to_string(tensor.numel()) + " elements to rank " + std::to_string(root) +
                          " on rank " + std::to_string(rank()),
                      seconds_text(options_.timeout()), impl_->reduces, impl_->reduce_bytes,
                      [&](std::vector<at::Tensor>& tensors) {
                        return impl_->backend_for(tensor, "reduce").reduce(tensors, opts);
                      });
}

Work ProcessGroup::broadcast(at::Tensor tensor, int64_t root) {
  if (world_size() == 1) {
    return {};
  }
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = options_.timeout();
  return start_rooted("broadcast", tensor, root, world_size(),
                      "broadcast from rank " + std::to_string(root) + " on rank " + std::to_string(rank()),
                      seconds_text(options_.timeout()), impl_->broadcasts, impl_->broadcast_bytes,
                      [&](std::vector<at::Tensor>& tensors) {
                        return impl_->backend_for(tensor, "broadcast").broadcast(tensors, opts);
                      });
}

void ProcessGroup::broadcast_tensors(const std::vector<at::Tensor>& tensors, int64_t root) {
  if (world_size() == 1 || tensors.empty()) {
    return;
  }
  // Group by (dtype, device) in first-seen order, which is the same on every rank.
  std::vector<std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) {
    bool placed = false;
    for (auto& g : groups) {
      if (g.front().scalar_type() == t.scalar_type() && g.front().device() == t.device()) {
        g.push_back(t);
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({t});
  }
  at::NoGradGuard no_grad;
  for (auto& g : groups) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : g) flat_parts.push_back(t.detach().reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    broadcast(flat, root).wait();
    int64_t offset = 0;
    for (auto& t : g) {
      t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

CommStats ProcessGroup::stats() const {
  CommStats s;
  s.all_reduces = impl_->all_reduces.load();
  s.all_reduce_bytes = impl_->all_reduce_bytes.load();
  s.broadcasts = impl_->broadcasts.load();
  s.broadcast_bytes = impl_->broadcast_bytes.load();
  s.reduces = impl_->reduces.load();
  s.reduce_bytes = impl_->reduce_bytes.load();
  return s;
}

void ProcessGroup::barrier() {
  if (world_size() == 1) {
    return;
  }
  // A one-element all-reduce: works on every backend and names the failure like any collective.
  auto t = at::zeros({1}, at::kFloat);
  all_reduce(t).wait();
}

std::vector<double> ProcessGroup::all_reduce_mean(const std::vector<double>& values) {
  if (world_size() == 1 || values.empty()) {
    return values;
  }
  auto t = at::tensor(values, at::kDouble);
  all_reduce(t, ReduceOp::AVG).wait();
  auto* p = t.data_ptr<double>();
  return std::vector<double>(p, p + values.size());
}

double ProcessGroup::all_reduce_mean(double value) { return all_reduce_mean(std::vector<double>{value}).front(); }

double ProcessGroup::all_reduce_sum(double value) {
  if (world_size() == 1) return value;
  auto t = at::full({1}, value, at::kDouble);
  all_reduce(t).wait();
  return t.item<double>();
}

double ProcessGroup::broadcast_value(double value, int64_t root) {
  if (world_size() == 1) return value;
  auto t = at::full({1}, value, at::kDouble);
  broadcast(t, root).wait();
  return t.item<double>();
}

}  // namespace trainkit::dist
