#include "trainkit/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

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

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) {
    throw CheckpointError(fmt::format("{}: cannot open for fsync: {}", path, std::strerror(errno)));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    throw CheckpointError(fmt::format("{}: fsync failed: {}", path, std::strerror(err)));
  }
}

const std::regex& checkpoint_name() {
  static const std::regex re(R"(ckpt-(\d+)\.tkpt)");
  return re;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes,
                       const std::function<void()>& before_rename) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::path tmp = dir / fmt::format(".{}.tmp.{}", target.filename().string(), ::getpid());
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) {
        throw CheckpointError(fmt::format("{}: cannot create: {}", tmp.string(), std::strerror(errno)));
      }
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      out.flush();
      if (!out) {
        throw CheckpointError(fmt::format("{}: write failed (disk full?)", tmp.string()));
      }
    }
    fsync_path(tmp.string(), O_RDONLY);
    if (before_rename) {
      before_rename();
    }
    std::error_code ec;
    fs::rename(tmp, target, ec);
    if (ec) {
      throw CheckpointError(fmt::format("{}: rename from {} failed: {}", path, tmp.string(), ec.message()));
    }
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  fsync_path(dir.string(), O_RDONLY | O_DIRECTORY);
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
  std::istringstream payload(bytes.substr(kHeaderSize));
  try {
    archive.load_from(payload);
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("{}: unreadable archive: {}", path, e.what()));
  }
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
