#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include "fuzz_target.h"
#include "fuzz_registry.h"

namespace trainkit::fuzz {
namespace {

/// The scratch files of this process, removed when it exits normally.
class ScratchFiles {
 public:
  ~ScratchFiles() {
    for (const auto& [slot, path] : paths_) {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  }
  const std::string& path(const std::string& slot) {
    auto it = paths_.find(slot);
    if (it == paths_.end()) {
      const char* tmp = std::getenv("TMPDIR");
      const std::filesystem::path dir = (tmp != nullptr && *tmp != '\0') ? tmp : "/tmp";
      const std::string name = "trainkit-fuzz-" + std::to_string(::getpid()) + "-" + slot;
      it = paths_.emplace(slot, (dir / name).string()).first;
    }
    return it->second;
  }

 private:
  std::map<std::string, std::string> paths_;
};

ScratchFiles& scratch_files() {
  static ScratchFiles files;
  return files;
}

}  // namespace

std::map<std::string, Target>& registry() {
  static std::map<std::string, Target> targets;
  return targets;
}

bool register_target(const char* name, Target target) {
  if (!registry().emplace(name, target).second) {
    std::fprintf(stderr, "fuzz target %s registered twice\n", name);
    std::abort();
  }
  return true;
}

void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

std::string scratch_file(const uint8_t* data, size_t size, const std::string& slot) {
  const std::string& path = scratch_files().path(slot);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    throw std::runtime_error(path + ": cannot write the fuzz input");
  }
  return path;
}

}  // namespace trainkit::fuzz
