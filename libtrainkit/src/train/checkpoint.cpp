#include "trainkit/train/checkpoint.h"

#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "detail/atomic_file.h"

namespace trainkit::train {
namespace {

namespace fs = std::filesystem;

constexpr std::array<char, 8> kMagic{'T', 'K', 'C', 'K', 'P', 'T', '\r', '\n'};
constexpr size_t kHeaderSize = 8 + 4 + 4 + 8 + 4 + 4;

template <class T>
void put_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff));
  }
}

template <class T>
T get_le(const char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return static_cast<T>(v);
}

uint32_t crc32_of(const std::string& data, size_t offset) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(data.data() + offset);
  size_t left = data.size() - offset;
  while (left > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    left -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

const std::regex& checkpoint_name() {
  static const std::regex re(R"(ckpt-(\d+)\.tkpt)");
  return re;
}

/// One line of the TorchScript source that torch::serialize::OutputArchive writes for each module of an
/// archive: the class line, the __parameters__/__buffers__/__annotations__ lists, and "name : Type" or
/// __annotations__["name"] = Type declarations, whose types are names, dots, brackets and commas (no call,
/// no operator). Anything else -- a `def`, a decorator, an expression -- is code the loader would compile
/// and could run (a class's __setstate__ runs while the archive loads).
bool is_declaration(const std::string& line) {
  static const std::regex declaration(
      R"(class Module\(Module\):)"
      R"(|  __(parameters|buffers|annotations)__ = \[("[^"\\]*", )*\])"
      R"(|  __annotations__\["[^"\\]*"\] = [A-Za-z_][A-Za-z0-9_.\[\], ]*)"
      R"(|  [A-Za-z_][A-Za-z0-9_]* : [A-Za-z_][A-Za-z0-9_.\[\], ]*)");
  return line.empty() || std::regex_match(line, declaration);
}

/// Refuses an archive that carries code: every TorchScript source in it (code/**/*.py) must declare
/// attributes only, as the archives trainkit writes do. Then nothing in the archive runs while it loads:
/// the unpickler builds only tensors, containers and these attribute-only classes.
void check_data_only(const std::string& payload, const std::string& path) {
  std::istringstream in(payload);
  std::vector<std::string> records;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(&in);
    records = reader->getAllRecords();
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("{}: unreadable archive: {}", path, e.what()));
  }
  for (const std::string& name : records) {
    if (name.rfind("code/", 0) != 0 || name.size() < 3 || name.compare(name.size() - 3, 3, ".py") != 0) {
      continue;
    }
    at::DataPtr data;
    size_t size = 0;
    try {
      std::tie(data, size) = reader->getRecord(name);
    } catch (const std::exception& e) {
      throw CheckpointError(fmt::format("{}: unreadable archive record {}: {}", path, name, e.what()));
    }
    std::istringstream source(std::string(static_cast<const char*>(data.get()), size));
    std::string line;
    for (int number = 1; std::getline(source, line); ++number) {
      if (!is_declaration(line)) {
        throw CheckpointError(fmt::format(
            "{}: refused: the archive carries code ({} line {}: \"{}\"), which loading would compile and could "
            "run; trainkit checkpoints hold data only (load a TorchScript model you trust with torch::jit::load)",
            path, name, number, line.substr(0, 80)));
      }
    }
  }
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes,
                       const std::function<void()>& before_rename) {
  try {
    detail::write_file_atomic(
        path, [&bytes](std::ostream& out) { out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); },
        before_rename);
  } catch (const detail::AtomicWriteError& e) {
    throw CheckpointError(e.what());
  }
}

void save_checkpoint(const std::string& path, torch::serialize::OutputArchive& archive,
                     const std::function<void()>& before_rename) {
  std::ostringstream payload_stream;
  archive.save_to(payload_stream);
  const std::string payload = payload_stream.str();
  std::string bytes;
  bytes.reserve(kHeaderSize + payload.size());
  bytes.append(kMagic.data(), kMagic.size());
  put_le<uint32_t>(bytes, kCheckpointFormatVersion);
  put_le<uint32_t>(bytes, 0);
  put_le<uint64_t>(bytes, payload.size());
  put_le<uint32_t>(bytes, crc32_of(payload, 0));
  put_le<uint32_t>(bytes, 0);
  bytes += payload;
  write_file_atomic(path, bytes, before_rename);
}

void load_checkpoint(const std::string& path, torch::serialize::InputArchive& archive) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw CheckpointError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < kHeaderSize) {
    throw CheckpointError(fmt::format("{}: truncated: {} bytes, shorter than the {}-byte header", path,
                                      bytes.size(), kHeaderSize));
  }
  if (!std::equal(kMagic.begin(), kMagic.end(), bytes.begin())) {
    throw CheckpointError(fmt::format("{}: not a trainkit checkpoint (bad magic)", path));
  }
  const auto version = get_le<uint32_t>(bytes.data() + 8);
  if (version == 0 || version > kCheckpointFormatVersion) {
    throw CheckpointError(fmt::format("{}: format version {} is not supported (this build reads 1 to {})",
                                      path, version, kCheckpointFormatVersion));
  }
  const auto size = get_le<uint64_t>(bytes.data() + 16);
  const auto crc = get_le<uint32_t>(bytes.data() + 24);
  if (bytes.size() - kHeaderSize != size) {
    throw CheckpointError(fmt::format("{}: truncated or padded: header promises {} payload bytes, file holds {}",
                                      path, size, bytes.size() - kHeaderSize));
  }
  if (crc32_of(bytes, kHeaderSize) != crc) {
    throw CheckpointError(fmt::format("{}: corrupted: payload CRC-32 does not match the header", path));
  }
  std::string payload_bytes = bytes.substr(kHeaderSize);
  check_data_only(payload_bytes, path);
  std::istringstream payload(std::move(payload_bytes));
  try {
    archive.load_from(payload);
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("{}: unreadable archive: {}", path, e.what()));
  }
}

void save_weights(const torch::nn::Module& module, const std::string& path) {
  torch::serialize::OutputArchive archive;
  module.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  write_file_atomic(path, bytes.str());
}

namespace {

struct Fnv1a {
  uint64_t h = 1469598103934665603ull;
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h = (h ^ p[i]) * 1099511628211ull;
    }
  }
  void add(const std::string& s) {
    add(s.data(), s.size());
    add("\0", 1);
  }
  void add(const at::Tensor& t) {
    const at::Tensor c = t.detach().cpu().contiguous();
    add(std::string(c10::toString(c.scalar_type())));
    for (const int64_t d : c.sizes()) {
      add(&d, sizeof d);
    }
    add(c.data_ptr(), c.nbytes());
  }
};

// Every tensor under `archive`, nested archives (submodules) included, by dotted name.
void collect_tensors(torch::serialize::InputArchive& archive, const std::string& prefix,
                     std::vector<std::pair<std::string, at::Tensor>>& out) {
  for (const std::string& key : archive.keys()) {
    at::Tensor t;
    if (archive.try_read(key, t)) {
      out.emplace_back(prefix + key, t);
      continue;
    }
    torch::serialize::InputArchive child;
    if (archive.try_read(key, child)) {
      collect_tensors(child, prefix + key + ".", out);
    }
  }
}

// Hashes `tensors` in the order of their names.
void add_sorted(Fnv1a& hash, std::vector<std::pair<std::string, at::Tensor>> tensors) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [name, t] : tensors) {
    hash.add(name);
    hash.add(t);
  }
}

}  // namespace

CheckpointDigest digest_checkpoint(const std::string& path) {
  torch::serialize::InputArchive archive;
  load_checkpoint(path, archive);
  CheckpointDigest d;
  Fnv1a hash;
  try {
    torch::serialize::InputArchive model;
    if (!archive.try_read("model", model)) {
      throw CheckpointError(fmt::format("{}: no \"model\" entry (not written by Trainer::save)", path));
    }
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    collect_tensors(model, "", tensors);
    d.tensors = static_cast<int64_t>(tensors.size());
    add_sorted(hash, std::move(tensors));
    for (const auto& [key, field] : {std::pair<const char*, int64_t*>{"trainer/epoch", &d.epoch},
                                     {"trainer/batch", &d.batch},
                                     {"trainer/step", &d.step}}) {
      at::Tensor t;
      if (archive.try_read(key, t)) {
        *field = t.item<int64_t>();
        hash.add(key);
        hash.add(t);
      }
    }
    at::Tensor rng;
    if (archive.try_read("rng/cpu", rng)) {
      hash.add("rng/cpu");
      hash.add(rng);
    }
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("{}: unreadable entry: {}", path, e.what_without_backtrace()));
  }
  d.digest = hash.h;
  return d;
}

uint64_t digest_parameters(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : module.named_parameters()) {
    tensors.emplace_back(item.key(), item.value());
  }
  Fnv1a hash;
  add_sorted(hash, std::move(tensors));
  return hash.h;
}

CheckpointManager::CheckpointManager(std::string dir, int64_t keep_last)
    : dir_(std::move(dir)), keep_last_(keep_last) {
  if (keep_last_ < 1) {
    throw std::invalid_argument(fmt::format("CheckpointManager: keep_last must be >= 1, got {}", keep_last_));
  }
}

std::string CheckpointManager::save(int64_t step, torch::serialize::OutputArchive& archive) {
  fs::create_directories(dir_);
  const std::string path = (fs::path(dir_) / fmt::format("ckpt-{:09d}.tkpt", step)).string();
  save_checkpoint(path, archive, before_rename_);
  remove_stale_temporaries();
  auto files = list();
  const auto keep = static_cast<size_t>(keep_last_);
  for (size_t i = 0; files.size() > keep && i < files.size() - keep; ++i) {
    std::error_code ec;
    fs::remove(files[i], ec);
    if (ec) {
      spdlog::warn("could not delete old checkpoint {}: {}", files[i], ec.message());
    }
  }
  return path;
}

void CheckpointManager::remove_stale_temporaries() const {
  // write_file_atomic names its temporary ".<name>.tmp.<pid>.<random>" (".<name>.tmp.<pid>" before); a
  // writer that was killed leaves it behind.
  static const std::regex temporary(R"(\.ckpt-\d+\.tkpt\.tmp\.(\d+)(\.[0-9a-f]+)?)");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, temporary)) {
      continue;
    }
    const auto pid = static_cast<pid_t>(std::stoll(m[1].str()));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) {
      continue;  // its writer may still run
    }
    std::error_code ignored;
    if (fs::remove(entry.path(), ignored)) {
      spdlog::info("removed {} (left by a writer that was killed mid-save)", entry.path().string());
    }
  }
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) {
    return {};
  }
  for (const auto& entry : fs::directory_iterator(dir_)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(name, m, checkpoint_name())) {
      found.emplace_back(std::stoll(m[1].str()), entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) {
    out.push_back(std::move(f.second));
  }
  return out;
}

std::optional<std::string> CheckpointManager::load_latest(torch::serialize::InputArchive& archive) const {
  const auto files = list();
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    try {
      torch::serialize::InputArchive candidate;
      load_checkpoint(*it, candidate);
      archive = std::move(candidate);
      return *it;
    } catch (const CheckpointError& e) {
      spdlog::warn("skipping damaged checkpoint: {}", e.what());
    }
  }
  return std::nullopt;
}

}  // namespace trainkit::train
