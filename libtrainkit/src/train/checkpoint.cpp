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
#include <random>
#include <regex>
#include <sstream>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
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

const std::regex& shard_name_pattern() {
  static const std::regex re(R"(ckpt-(\d+)\.rank(\d+)-of-(\d+)\.tkpt)");
  return re;
}

const std::regex& commit_name_pattern() {
  static const std::regex re(R"(ckpt-(\d+)\.commit)");
  return re;
}

std::string shard_name(int64_t step, int64_t rank, int64_t world) {
  return fmt::format("ckpt-{:09d}.rank{}-of-{}.tkpt", step, rank, world);
}

std::string commit_name(int64_t step) { return fmt::format("ckpt-{:09d}.commit", step); }

/// A commit record: `trainkit-commit 1`, then `step S`, `world_size W`, `token T` and one
/// `shard <rank> <file name> <bytes> <payload CRC-32>` line per rank, in rank order.
struct CommitRecord {
  int64_t step = -1;
  int64_t token = 0;
  struct Shard {
    std::string name;
    int64_t size = 0;
    int64_t crc = 0;
  };
  std::vector<Shard> shards;
};

std::string commit_text(const CommitRecord& record) {
  std::string text = fmt::format("trainkit-commit 1\nstep {}\nworld_size {}\ntoken {}\n", record.step,
                                 record.shards.size(), record.token);
  for (size_t r = 0; r < record.shards.size(); ++r) {
    const auto& shard = record.shards[r];
    text += fmt::format("shard {} {} {} {}\n", r, shard.name, shard.size, shard.crc);
  }
  return text;
}

/// Reads a commit record; CheckpointError naming the file and the line when it is not one.
CommitRecord read_commit(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw CheckpointError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  CommitRecord record;
  std::string line;
  int64_t world = -1;
  for (int number = 1; std::getline(in, line); ++number) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    bool ok = true;
    if (number == 1) {
      int64_t version = 0;
      ok = key == "trainkit-commit" && (fields >> version) && version == 1;
    } else if (key == "step") {
      ok = static_cast<bool>(fields >> record.step);
    } else if (key == "world_size") {
      ok = static_cast<bool>(fields >> world) && world >= 1;
    } else if (key == "token") {
      ok = static_cast<bool>(fields >> record.token);
    } else if (key == "shard") {
      int64_t rank = -1;
      CommitRecord::Shard shard;
      ok = (fields >> rank >> shard.name >> shard.size >> shard.crc) &&
           rank == static_cast<int64_t>(record.shards.size()) && shard.name.find('/') == std::string::npos;
      record.shards.push_back(shard);
    } else {
      ok = false;
    }
    if (!ok) {
      throw CheckpointError(fmt::format("{}: line {} is not a commit record's: \"{}\"", path, number, line.substr(0, 80)));
    }
  }
  if (record.step < 0 || world != static_cast<int64_t>(record.shards.size())) {
    throw CheckpointError(fmt::format("{}: incomplete commit record (step {}, world size {}, {} shards listed)", path,
                                      record.step, world, record.shards.size()));
  }
  return record;
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

namespace {

/// The bytes of a checkpoint file holding `archive`: header (magic, version, size, CRC-32), then payload.
std::string encode_checkpoint(torch::serialize::OutputArchive& archive) {
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
  return bytes;
}

/// The payload CRC-32 that the header of a checkpoint's bytes records.
uint32_t header_crc(const std::string& bytes) { return get_le<uint32_t>(bytes.data() + 24); }

/// The bytes of the checkpoint file at `path`, after its header, size and CRC-32 checks.
std::string read_verified(const std::string& path) {
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
  if (bytes.size() - kHeaderSize != size) {
    throw CheckpointError(fmt::format("{}: truncated or padded: header promises {} payload bytes, file holds {}",
                                      path, size, bytes.size() - kHeaderSize));
  }
  if (crc32_of(bytes, kHeaderSize) != header_crc(bytes)) {
    throw CheckpointError(fmt::format("{}: corrupted: payload CRC-32 does not match the header", path));
  }
  return bytes;
}

}  // namespace

void save_checkpoint(const std::string& path, torch::serialize::OutputArchive& archive,
                     const std::function<void()>& before_rename) {
  write_file_atomic(path, encode_checkpoint(archive), before_rename);
}

void load_checkpoint(const std::string& path, torch::serialize::InputArchive& archive) {
  std::string payload_bytes = read_verified(path).substr(kHeaderSize);
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

void CheckpointManager::set_sharded(CheckpointGroup group) {
  if (group.world_size > 1 && !group.all_gather) {
    throw std::invalid_argument("CheckpointManager::set_sharded: a group of several ranks needs all_gather");
  }
  group_ = std::move(group);
  sharded_ = group_.world_size > 1;
}

std::string CheckpointManager::save(int64_t step, torch::serialize::OutputArchive& archive) {
  fs::create_directories(dir_);
  std::string path;
  if (sharded_) {
    path = save_shard(step, archive);
  } else {
    path = (fs::path(dir_) / fmt::format("ckpt-{:09d}.tkpt", step)).string();
    save_checkpoint(path, archive, before_rename_);
  }
  remove_stale_temporaries();
  const auto complete = entries();
  std::vector<std::string> keep;
  const auto kept = static_cast<size_t>(keep_last_);
  for (size_t i = complete.size() > kept ? complete.size() - kept : 0; i < complete.size(); ++i) {
    keep.push_back(complete[i].name());
    keep.insert(keep.end(), complete[i].files.begin(), complete[i].files.end());
  }
  prune(keep);
  return path;
}

namespace {

constexpr const char* kSharedDirectoryHint =
    "every rank must see the same checkpoint directory (one machine, or a filesystem that all machines share, "
    "such as NFS): each rank writes its own shard there and rank 0 commits the step";

std::string rank_list(const std::vector<int64_t>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

std::string CheckpointManager::save_shard(int64_t step, torch::serialize::OutputArchive& archive) {
  const int64_t rank = group_.rank;
  const int64_t world = group_.world_size;
  const std::string path = (fs::path(dir_) / shard_name(step, rank, world)).string();
  const std::string bytes = encode_checkpoint(archive);
  write_file_atomic(path, bytes, before_rename_);
  // Phase 1: every rank's shard is durable (write_file_atomic fsyncs it and the directory).
  int64_t token = 0;
  if (rank == 0) {
    std::random_device random;
    token = static_cast<int64_t>(((static_cast<uint64_t>(random()) << 32) | random()) >> 2);
  }
  const auto reports =
      group_.all_gather({step, static_cast<int64_t>(bytes.size()), static_cast<int64_t>(header_crc(bytes)), token});
  std::vector<std::string> steps;
  bool same = true;
  for (size_t r = 0; r < reports.size(); ++r) {
    steps.push_back(fmt::format("rank {} step {}", r, reports[r].at(0)));
    same = same && reports[r].at(0) == step;
  }
  if (!same) {
    throw CheckpointError(fmt::format("checkpoint: the ranks saved different steps ({}); every rank must save at the "
                                      "same steps",
                                      fmt::join(steps, ", ")));
  }
  token = reports[0].at(3);
  const std::string commit = (fs::path(dir_) / commit_name(step)).string();
  // Phase 2: rank 0 checks that it sees every shard as its rank reported it, then commits.
  std::vector<int64_t> status{0};  // rank 0: 0 committed, 1 shards not seen (their ranks follow), 2 write failed
  std::string failure;
  if (rank == 0) {
    CommitRecord record;
    record.step = step;
    record.token = token;
    for (int64_t r = 0; r < world; ++r) {
      const std::string name = shard_name(step, r, world);
      std::error_code ec;
      const auto size = fs::file_size(fs::path(dir_) / name, ec);
      if (ec || static_cast<int64_t>(size) != reports[static_cast<size_t>(r)].at(1)) status.push_back(r);
      record.shards.push_back({name, reports[static_cast<size_t>(r)].at(1), reports[static_cast<size_t>(r)].at(2)});
    }
    if (status.size() > 1) {
      status[0] = 1;
    } else {
      try {
        write_file_atomic(commit, commit_text(record));
      } catch (const CheckpointError& e) {
        status[0] = 2;
        failure = e.what();
      }
    }
  }
  const auto committed = group_.all_gather(status).at(0);
  if (committed.at(0) == 1) {
    throw CheckpointError(fmt::format(
        "checkpoint step {} not committed: rank 0 does not see the shards of {} (such as {}); {}", step,
        rank_list(std::vector<int64_t>(committed.begin() + 1, committed.end())), shard_name(step, committed.at(1), world),
        kSharedDirectoryHint));
  }
  if (committed.at(0) == 2) {
    throw CheckpointError(fmt::format("checkpoint step {} not committed: rank 0 could not write {}{}", step, commit,
                                      failure.empty() ? "" : ": " + failure));
  }
  // Phase 3: every rank sees the commit record that rank 0 wrote.
  bool sees = true;
  if (rank != 0) {
    try {
      sees = read_commit(commit).token == token;
    } catch (const CheckpointError&) {
      sees = false;
    }
  }
  std::vector<int64_t> blind;
  const auto seen = group_.all_gather({sees ? 1 : 0});
  for (size_t r = 0; r < seen.size(); ++r) {
    if (seen[r].at(0) == 0) blind.push_back(static_cast<int64_t>(r));
  }
  if (!blind.empty()) {
    throw CheckpointError(fmt::format("checkpoint step {}: {} {} not see rank 0's commit record {}; {}", step,
                                      rank_list(blind), blind.size() == 1 ? "does" : "do", commit,
                                      kSharedDirectoryHint));
  }
  return path;
}

void CheckpointManager::prune(const std::vector<std::string>& keep_names) const {
  // Whole checkpoints, commit records and shards of steps older than the oldest kept checkpoint, and
  // shards that no commit covers once a newer step is committed (a save interrupted on some rank).
  const auto complete = entries();
  if (complete.empty()) {
    return;
  }
  const size_t kept = std::min(complete.size(), static_cast<size_t>(keep_last_));
  const int64_t oldest_kept = complete[complete.size() - kept].step;
  const int64_t newest = complete.back().step;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    const bool whole = std::regex_match(name, m, checkpoint_name()) || std::regex_match(name, m, commit_name_pattern());
    const bool shard = !whole && std::regex_match(name, m, shard_name_pattern());
    if (!whole && !shard) {
      continue;
    }
    const int64_t step = std::stoll(m[1].str());
    const bool kept_file = std::find(keep_names.begin(), keep_names.end(), entry.path().string()) != keep_names.end();
    if (kept_file || step >= newest || (step >= oldest_kept && !shard)) {
      continue;
    }
    std::error_code removed;
    fs::remove(entry.path(), removed);
    if (removed && removed != std::errc::no_such_file_or_directory) {
      spdlog::warn("could not delete old checkpoint {}: {}", entry.path().string(), removed.message());
    }
  }
}

void CheckpointManager::remove_stale_temporaries() const {
  // write_file_atomic names its temporary ".<name>.tmp.<pid>.<random>" (".<name>.tmp.<pid>" before); a
  // writer that was killed leaves it behind.
  static const std::regex temporary(R"(\.ckpt-\d+(\.tkpt|\.rank\d+-of-\d+\.tkpt|\.commit)\.tmp\.(\d+)(\.[0-9a-f]+)?)");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, temporary)) {
      continue;
    }
    const auto pid = static_cast<pid_t>(std::stoll(m[2].str()));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) {
      continue;  // its writer may still run
    }
    std::error_code ignored;
    if (fs::remove(entry.path(), ignored)) {
      spdlog::info("removed {} (left by a writer that was killed mid-save)", entry.path().string());
    }
  }
}

namespace {

/// The checkpoint that commit record `path` names, when every shard it lists is beside it with the recorded
/// size; CheckpointError naming the record and the shard otherwise.
CheckpointEntry commit_entry(const std::string& path) {
  CheckpointEntry e;
  e.commit = path;
  const CommitRecord record = read_commit(path);
  e.step = record.step;
  for (const auto& shard : record.shards) {
    const fs::path file = fs::path(path).parent_path() / shard.name;
    std::error_code size_ec;
    const auto size = fs::file_size(file, size_ec);
    if (size_ec || static_cast<int64_t>(size) != shard.size) {
      throw CheckpointError(fmt::format("{}: its shard {} is {}", path, file.string(),
                                        size_ec ? "missing" : fmt::format("{} bytes, not {}", size, shard.size)));
    }
    e.files.push_back(file.string());
  }
  return e;
}

}  // namespace

std::vector<CheckpointEntry> CheckpointManager::entries() const {
  std::vector<CheckpointEntry> found;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) {
    return {};
  }
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file(ec)) {
      continue;
    }
    if (std::regex_match(name, m, checkpoint_name())) {
      CheckpointEntry e;
      e.step = std::stoll(m[1].str());
      e.files = {entry.path().string()};
      found.push_back(std::move(e));
    } else if (std::regex_match(name, m, commit_name_pattern())) {
      // A commit counts when every shard it names is there with its size (latest() checks the CRCs).
      try {
        found.push_back(commit_entry(entry.path().string()));
      } catch (const CheckpointError& error) {
        spdlog::debug("skipping incomplete checkpoint: {}", error.what());
      }
    }
  }
  // Oldest first; a commit after a whole file of the same step.
  std::sort(found.begin(), found.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
    return std::make_tuple(a.step, !a.commit.empty(), a.name()) < std::make_tuple(b.step, !b.commit.empty(), b.name());
  });
  return found;
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::string> out;
  for (const auto& e : entries()) {
    out.push_back(e.name());
  }
  return out;
}

namespace {

/// Checks every file of `entry` (size, CRC-32, and a shard's CRC against its commit record); throws
/// CheckpointError naming the file.
void verify(const CheckpointEntry& entry) {
  if (entry.commit.empty()) {
    read_verified(entry.files.front());
    return;
  }
  const CommitRecord record = read_commit(entry.commit);
  for (size_t r = 0; r < entry.files.size(); ++r) {
    const std::string bytes = read_verified(entry.files[r]);
    if (static_cast<int64_t>(header_crc(bytes)) != record.shards.at(r).crc) {
      throw CheckpointError(
          fmt::format("{}: not the shard that {} committed (CRC-32 differs)", entry.files[r], entry.commit));
    }
  }
}

}  // namespace

std::optional<CheckpointEntry> CheckpointManager::latest() const {
  const auto complete = entries();
  for (auto it = complete.rbegin(); it != complete.rend(); ++it) {
    try {
      verify(*it);
      return *it;
    } catch (const CheckpointError& e) {
      spdlog::warn("skipping damaged checkpoint: {}", e.what());
    }
  }
  return std::nullopt;
}

std::optional<std::string> CheckpointManager::load_latest(torch::serialize::InputArchive& archive) const {
  const auto complete = entries();
  for (auto it = complete.rbegin(); it != complete.rend(); ++it) {
    try {
      verify(*it);
      torch::serialize::InputArchive candidate;
      load_checkpoint(it->files.front(), candidate);
      archive = std::move(candidate);
      return it->name();
    } catch (const CheckpointError& e) {
      spdlog::warn("skipping damaged checkpoint: {}", e.what());
    }
  }
  return std::nullopt;
}

CheckpointEntry verify_commit(const std::string& path) {
  CheckpointEntry entry = commit_entry(path);
  verify(entry);
  return entry;
}

void check_same_checkpoint(int64_t step, const std::string& dir, const CheckpointGroup& group) {
  if (group.world_size <= 1 || !group.all_gather) {
    return;
  }
  const auto steps = group.all_gather({step});
  std::vector<std::string> seen;
  bool same = true;
  for (size_t r = 0; r < steps.size(); ++r) {
    const int64_t s = steps[r].at(0);
    seen.push_back(s < 0 ? fmt::format("rank {}: none", r) : fmt::format("rank {}: step {}", r, s));
    same = same && s == steps[0].at(0);
  }
  if (!same) {
    throw CheckpointError(fmt::format(
        "resume: the ranks found different newest checkpoints in {} ({}); {}, so that every rank finds the same "
        "committed steps",
        dir, fmt::join(seen, ", "), kSharedDirectoryHint));
  }
}

}  // namespace trainkit::train
