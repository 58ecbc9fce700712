#include "trainkit/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "detail/atomic_file.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so must the host be");

namespace trainkit::io {
namespace {

using Json = nlohmann::json;

// The Python package's Rust core refuses larger headers.
constexpr uint64_t kMaxHeader = 100'000'000;
constexpr char kMetadataKey[] = "__metadata__";

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  size_t size;
  int rank;  // the writer's order: larger ranks first (the Python writer's dtype order, which keeps alignment)
};

// The dtypes PyTorch's state_dicts hold; ranks follow the reference writer's order (I64 before F64,
// F32 before I32, BF16 before F16), so that a file trainkit writes lays out its tensors as Python's does.
constexpr std::array<DtypeInfo, 10> kDtypes{{{"I64", at::kLong, 8, 9},
                                            {"F64", at::kDouble, 8, 8},
                                            {"F32", at::kFloat, 4, 7},
                                            {"I32", at::kInt, 4, 6},
                                            {"BF16", at::kBFloat16, 2, 5},
                                            {"F16", at::kHalf, 2, 4},
                                            {"I16", at::kShort, 2, 3},
                                            {"I8", at::kChar, 1, 2},
                                            {"U8", at::kByte, 1, 1},
                                            {"BOOL", at::kBool, 1, 0}}};

const DtypeInfo* dtype_by_name(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      return &d;
    }
  }
  return nullptr;
}

const DtypeInfo* dtype_by_type(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (type == d.type) {
      return &d;
    }
  }
  return nullptr;
}

// A read-only file mapped privately (copy-on-write): the tensors of a loaded file keep it alive.
class Mapping {
 public:
  Mapping(void* address, size_t size) : address_(address), size_(size) {}
  ~Mapping() { ::munmap(address_, size_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* data() const { return static_cast<char*>(address_); }

 private:
  void* address_;
  size_t size_;
};

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct Entry {
  std::string name;
  const DtypeInfo* dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw IoError(fmt::format("{}: {}", path, what));
}

uint64_t json_offset(const std::string& path, const std::string& name, const Json& v, const char* field) {
  if (!v.is_number_unsigned()) {
    fail(path, fmt::format("tensor '{}': {} holds {}, not a non-negative integer", name, field, v.dump()));
  }
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& path, const std::string& name, const Json& v, uint64_t buffer_size) {
  if (!v.is_object()) {
    fail(path, fmt::format("tensor '{}': entry is {}, not a JSON object", name, v.type_name()));
  }
  Entry e;
  e.name = name;
  const auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) {
    fail(path, fmt::format("tensor '{}': no \"dtype\" string", name));
  }
  e.dtype = dtype_by_name(dtype->get<std::string>());
  if (e.dtype == nullptr) {
    fail(path, fmt::format("tensor '{}': unknown dtype '{}' (known: F64, F32, F16, BF16, I64, I32, I16, I8, U8, "
                           "BOOL)",
                           name, dtype->get<std::string>()));
  }
  const auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) {
    fail(path, fmt::format("tensor '{}': no \"shape\" array", name));
  }
  uint64_t bytes = e.dtype->size;
  for (const auto& dim : *shape) {
    const uint64_t d = json_offset(path, name, dim, "shape");
    if (d > static_cast<uint64_t>(INT64_MAX) || (d != 0 && bytes > UINT64_MAX / d)) {
      fail(path, fmt::format("tensor '{}': shape {} overflows", name, shape->dump()));
    }
    bytes *= d;
    e.shape.push_back(static_cast<int64_t>(d));
  }
  const auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2) {
    fail(path, fmt::format("tensor '{}': no \"data_offsets\" array of [begin, end]", name));
  }
  e.begin = json_offset(path, name, (*offsets)[0], "data_offsets");
  e.end = json_offset(path, name, (*offsets)[1], "data_offsets");
  if (e.begin > e.end) {
    fail(path, fmt::format("tensor '{}': data_offsets [{}, {}] end before they begin", name, e.begin, e.end));
  }
  if (e.end > buffer_size) {
    fail(path, fmt::format("tensor '{}': data_offsets [{}, {}] run past the end of the {}-byte data", name, e.begin,
                           e.end, buffer_size));
  }
  if (e.end - e.begin != bytes) {
    fail(path, fmt::format("tensor '{}': shape {} of {} needs {} bytes, but data_offsets [{}, {}] hold {}", name,
                           shape->dump(), e.dtype->name, bytes, e.begin, e.end, e.end - e.begin));
  }
  return e;
}

// The header's JSON has depth 3 at most ({name: {"shape": [dims]}}); refusing deeper input early keeps a
// hostile header from building deep trees.
Json parse_header(const std::string& path, const char* begin, const char* end) {
  // A safetensors header nests three brackets deep ({ {"shape": [...]} }). Deeper nesting is refused by
  // one pass over the text before parsing (a parser callback would do it too, but nlohmann's callback
  // parser scans the enclosing object at every closing brace: quadratic in the number of tensors).
  int depth = 0;
  bool in_string = false;
  for (const char* c = begin; c != end; ++c) {
    if (in_string) {
      if (*c == '\\' && c + 1 != end) {
        ++c;
      } else if (*c == '"') {
        in_string = false;
      }
    } else if (*c == '"') {
      in_string = true;
    } else if (*c == '{' || *c == '[') {
      if (++depth > 4) {
        fail(path, "header JSON nests deeper than a safetensors header does");
      }
    } else if (*c == '}' || *c == ']') {
      --depth;
    }
  }
  try {
    return Json::parse(begin, end);
  } catch (const Json::exception& e) {
    fail(path, fmt::format("header is not valid JSON: {}", e.what()));
  }
}

std::string header_of(const std::vector<std::pair<std::string, at::Tensor>>& ordered,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    header[kMetadataKey] = metadata;
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : ordered) {
    const uint64_t bytes = static_cast<uint64_t>(t.nbytes());
    header[name] = {{"dtype", dtype_by_type(t.scalar_type())->name},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::type_error& e) {
    throw std::invalid_argument(fmt::format("save_safetensors: a tensor name or metadata text is not UTF-8: {}",
                                            e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

void save_safetensors(const std::string& path, const TensorDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, at::Tensor>> ordered;
  ordered.reserve(tensors.size());
  for (const auto& item : tensors) {
    const at::Tensor& t = item.value();
    if (item.key() == kMetadataKey) {
      throw std::invalid_argument(fmt::format("save_safetensors: a tensor cannot be named '{}'", kMetadataKey));
    }
    if (!t.defined()) {
      throw std::invalid_argument(fmt::format("save_safetensors: tensor '{}' is undefined", item.key()));
    }
    if (dtype_by_type(t.scalar_type()) == nullptr) {
      throw std::invalid_argument(fmt::format("save_safetensors: tensor '{}' has dtype {}, which safetensors files "
                                              "of trainkit do not hold",
                                              item.key(), c10::toString(t.scalar_type())));
    }
    ordered.emplace_back(item.key(), t.detach().to(at::kCPU).contiguous());
  }
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    const int ra = dtype_by_type(a.second.scalar_type())->rank;
    const int rb = dtype_by_type(b.second.scalar_type())->rank;
    return ra != rb ? ra > rb : a.first < b.first;
  });
  const std::string header = header_of(ordered, metadata);
  try {
    detail::write_file_atomic(path, [&](std::ostream& out) {
      std::array<char, 8> length{};
      for (size_t i = 0; i < 8; ++i) {
        length[i] = static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
      }
      out.write(length.data(), length.size());
      out.write(header.data(), static_cast<std::streamsize>(header.size()));
      for (const auto& item : ordered) {
        out.write(static_cast<const char*>(item.second.const_data_ptr()),
                  static_cast<std::streamsize>(item.second.nbytes()));
      }
    });
  } catch (const detail::AtomicWriteError& e) {
    throw IoError(e.what());
  }
}

void save_safetensors(const std::string& path, const torch::nn::Module& module,
                      const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, state_dict(module), metadata);
}

SafetensorsFile load_safetensors(const std::string& path) {
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    fail(path, fmt::format("cannot stat: {}", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    fail(path, "not a regular file");
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    fail(path, fmt::format("truncated: {} bytes, shorter than the 8-byte header length", file_size));
  }
  void* address = ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), 0);
  if (address == MAP_FAILED) {
    fail(path, fmt::format("cannot map: {}", std::strerror(errno)));
  }
  const auto mapping = std::make_shared<Mapping>(address, file_size);
  const char* base = mapping->data();
  uint64_t header_size = 0;
  for (size_t i = 0; i < 8; ++i) {
    header_size |= static_cast<uint64_t>(static_cast<unsigned char>(base[i])) << (8 * i);
  }
  if (header_size > file_size - 8) {
    fail(path, fmt::format("truncated: the header length is {} bytes, but only {} bytes follow it", header_size,
                           file_size - 8));
  }
  if (header_size > kMaxHeader) {
    fail(path, fmt::format("header of {} bytes is larger than the {}-byte limit", header_size, kMaxHeader));
  }
  const Json header = parse_header(path, base + 8, base + 8 + header_size);
  if (!header.is_object()) {
    fail(path, fmt::format("header is a JSON {}, not an object", header.type_name()));
  }
  const uint64_t buffer_size = file_size - 8 - header_size;
  const char* buffer = base + 8 + header_size;

  SafetensorsFile file;
  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) {
        fail(path, fmt::format("{} is a JSON {}, not an object", kMetadataKey, value.type_name()));
      }
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          fail(path, fmt::format("{}: the value of '{}' is a JSON {}, not a string", kMetadataKey, key,
                                 text.type_name()));
        }
        file.metadata.emplace(key, text.get<std::string>());
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, value, buffer_size));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const auto& e : entries) {
    if (e.begin < covered) {
      fail(path, fmt::format("tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", e.name, e.begin,
                             e.end, previous->name, previous->begin, previous->end));
    }
    if (e.begin > covered) {
      fail(path, fmt::format("tensor '{}': data_offsets [{}, {}] leave a hole of {} bytes before it", e.name,
                             e.begin, e.end, e.begin - covered));
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != buffer_size) {
    fail(path, fmt::format("{} bytes of data after the last tensor ({} bytes of data, tensors cover {})",
                           buffer_size - covered, buffer_size, covered));
  }

  for (const auto& e : entries) {
    const auto options = at::TensorOptions().dtype(e.dtype->type);
    const char* data = buffer + e.begin;
    const uint64_t bytes = e.end - e.begin;
    if (e.dtype->type == at::kBool) {
      const char* bad = std::find_if(data, data + bytes, [](char c) { return c != 0 && c != 1; });
      if (bad != data + bytes) {
        fail(path, fmt::format("tensor '{}': BOOL element {} is the byte {}, not 0 or 1", e.name, bad - data,
                               static_cast<unsigned>(static_cast<unsigned char>(*bad))));
      }
    }
    at::Tensor t;
    if (bytes == 0) {
      t = at::empty(e.shape, options);
    } else if (reinterpret_cast<uintptr_t>(data) % e.dtype->size == 0) {
      t = torch::from_blob(const_cast<char*>(data), e.shape, [mapping](void*) {}, options);
    } else {
      t = at::empty(e.shape, options);
      std::memcpy(t.data_ptr(), data, bytes);
    }
    file.tensors.insert(e.name, std::move(t));
  }
  return file;
}

LoadReport load_safetensors(torch::nn::Module& module, const std::string& path, const LoadOptions& options) {
  return load_state_dict(module, load_safetensors(path).tensors, options, path);
}

}  // namespace trainkit::io
