#include "trainkit/io/torch_save.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/torch.h>

#include "detail/atomic_file.h"

namespace trainkit::io {
namespace {

// Python's torch.save(model.state_dict()) pickles (protocol 2) a collections.OrderedDict, whose attributes
// (`_metadata`) a final BUILD sets. LibTorch's unpickler turns every OrderedDict into None and runs BUILD as a
// call, so such a pickle is rewritten first: the top-level "GLOBAL collections.OrderedDict, BINPUT 0,
// EMPTY_TUPLE, REDUCE" keeps the class (memo 0: the tensors' empty backward-hook OrderedDicts still call it,
// and their None is ignored) and pushes an EMPTY_DICT beside it; the attributes and their BUILD are cut,
// and TUPLE2 ends the pickle with (class, dict), whose second element is the state_dict.
constexpr char kOrderedDictPrologue[] = "\x80\x02"
                                        "ccollections\nOrderedDict\nq\x00)R";
constexpr size_t kPrologueSize = sizeof(kOrderedDictPrologue) - 1;

uint64_t le32(const std::string& p, size_t at) {
  uint64_t v = 0;
  for (size_t k = 0; k < 4; ++k) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[at + k])) << (8 * k);
  }
  return v;
}

// Walks the opcodes of a protocol-2 pickle, tracking where each stack item's opcodes begin. Returns where to
// cut it so that only the two bottom items remain: the start of the third item under a final "BUILD, STOP",
// or the final STOP itself when two items are left; std::nullopt for anything else (an opcode it does not
// know, a malformed stream), in which case the pickle is left as it is.
std::optional<size_t> cut_for_two_items(const std::string& p) {
  struct Item {
    size_t start;
    bool mark;
  };
  std::vector<Item> stack;
  const auto pop_to_mark = [&stack]() -> std::optional<size_t> {
    while (!stack.empty() && !stack.back().mark) {
      stack.pop_back();
    }
    if (stack.empty()) {
      return std::nullopt;
    }
    const size_t start = stack.back().start;
    stack.pop_back();
    return start;
  };
  size_t i = 0;
  while (i < p.size()) {
    const size_t at = i++;
    const auto op = static_cast<unsigned char>(p[at]);
    size_t arg = 0;
    size_t pops = 0;  // items consumed by an opcode that leaves one item starting where the first began
    bool push = false;
    switch (op) {
      case '(': stack.push_back({at, true}); break;
      case ')': case '}': case ']': case 'N': case 0x88: case 0x89: push = true; break;
      case 'K': case 'h': arg = 1; push = true; break;
      case 'M': arg = 2; push = true; break;
      case 'J': case 'j': arg = 4; push = true; break;
      case 'G': arg = 8; push = true; break;
      case 0x8a: case 'U': case 'C':
        if (i >= p.size()) {
          return std::nullopt;
        }
        arg = 1 + static_cast<unsigned char>(p[i]);
        push = true;
        break;
      case 'X': case 'T': case 'B':
        if (i + 4 > p.size()) {
          return std::nullopt;
        }
        arg = 4 + le32(p, i);
        push = true;
        break;
      case 'c': {
        const size_t first = p.find('\n', i);
        const size_t second = first == std::string::npos ? first : p.find('\n', first + 1);
        if (second == std::string::npos) {
          return std::nullopt;
        }
        arg = second + 1 - i;
        push = true;
        break;
      }
      case 'q': case 0x80: arg = 1; break;
      case 'r': arg = 4; break;
      case 0x85: case 'Q': pops = 1; break;
      case 0x86: case 'R': case 0x81: pops = 2; break;
      case 0x87: pops = 3; break;
      case 'b':
        if (at + 2 == p.size() && p[at + 1] == '.' && stack.size() == 3 && !stack.back().mark) {
          return stack.back().start;
        }
        pops = 2;
        break;
      case 't': case 'l': case 'd': {
        const auto start = pop_to_mark();
        if (!start) {
          return std::nullopt;
        }
        stack.push_back({*start, false});
        break;
      }
      case 's':
        if (stack.size() < 2) {
          return std::nullopt;
        }
        stack.resize(stack.size() - 2);
        break;
      case 'u': case 'e':
        if (!pop_to_mark()) {
          return std::nullopt;
        }
        break;
      case 'a': case '0':
        if (stack.empty()) {
          return std::nullopt;
        }
        stack.pop_back();
        break;
      case '.':
        if (at + 1 == p.size() && stack.size() == 2) {
          return at;
        }
        return std::nullopt;
      default: return std::nullopt;
    }
    if (push) {
      stack.push_back({at, false});
    }
    if (pops > 0) {
      if (stack.size() < pops) {
        return std::nullopt;
      }
      const size_t start = stack[stack.size() - pops].start;
      stack.resize(stack.size() - pops);
      stack.push_back({start, false});
    }
    if (arg > p.size() - i) {
      return std::nullopt;
    }
    i += arg;
  }
  return std::nullopt;
}

// The rewrite above; true when `pickle` was rewritten (its object is then the tuple (class, state_dict)).
bool ordered_dict_as_tuple(std::string& pickle) {
  if (pickle.compare(0, kPrologueSize, kOrderedDictPrologue, kPrologueSize) != 0) {
    return false;
  }
  std::string rewritten = pickle;
  rewritten[kPrologueSize - 2] = '}';  // EMPTY_TUPLE, REDUCE -> EMPTY_DICT
  rewritten.erase(kPrologueSize - 1, 1);
  const std::optional<size_t> cut = cut_for_two_items(rewritten);
  if (!cut) {
    return false;
  }
  rewritten.resize(*cut);
  rewritten += "\x86.";  // TUPLE2, STOP
  pickle = std::move(rewritten);
  return true;
}

}  // namespace

void save_pt(const std::string& path, const TensorDict& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& item : tensors) {
    if (!item.value().defined()) {
      throw std::invalid_argument(fmt::format("save_pt: tensor '{}' is undefined", item.key()));
    }
    at::Tensor t = item.value().detach().to(at::kCPU);
    // The pickle holds whole storages: a view is written as its own compact copy, not with its base.
    if (!t.is_contiguous() || t.storage_offset() != 0 || t.storage().nbytes() != t.nbytes()) {
      t = t.clone(at::MemoryFormat::Contiguous);
    }
    dict.insert(item.key(), t);
  }
  // torch::pickle_save's steps, but with untagged containers: a tagged dict is wrapped in
  // torch.jit._pickle.restore_type_tag, a global that torch.load(weights_only=True) refuses.
  std::string pickle;
  torch::jit::Pickler pickler([&pickle](const char* bytes, size_t n) { pickle.append(bytes, n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  try {
    detail::write_file_atomic(path, [&](std::ostream& out) {
      caffe2::serialize::PyTorchStreamWriter writer([&out](const void* bytes, size_t n) {
        out.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
        return n;
      });
      torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
      writer.writeEndOfFile();
    });
  } catch (const detail::AtomicWriteError& e) {
    throw IoError(e.what());
  }
}

void save_pt(const std::string& path, const torch::nn::Module& module) { save_pt(path, state_dict(module)); }

c10::IValue load_pt_object(const std::string& path) {
  if (!std::ifstream(path, std::ios::binary)) {
    throw IoError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  c10::IValue value;
  try {
    // The steps of torch::pickle_load (one archive "data.pkl", storages under "data/"), with the pickle
    // made readable first and the storages put on the CPU whatever device they were saved from.
    caffe2::serialize::PyTorchStreamReader reader(path);
    const auto [data, size] = reader.getRecord("data.pkl");
    std::string pickle(static_cast<const char*>(data.get()), size);
    const bool wrapped = ordered_dict_as_tuple(pickle);
    size_t consumed = 0;
    torch::jit::Unpickler unpickler(
        [&pickle, &consumed](char* out, size_t n) {
          n = std::min(n, pickle.size() - consumed);
          std::memcpy(out, pickle.data() + consumed, n);
          consumed += n;
          return n;
        },
        nullptr, nullptr,
        [&reader](const std::string& name) { return std::get<0>(reader.getRecord("data/" + name)); },
        c10::Device(c10::kCPU));
    unpickler.set_version(reader.version());
    value = unpickler.parse_ivalue();
    if (wrapped && value.isTuple() && value.toTupleRef().elements().size() == 2) {
      value = value.toTupleRef().elements()[1];
    }
  } catch (const c10::Error& e) {
    throw IoError(fmt::format("{}: not a readable torch.save file: {}", path, e.what_without_backtrace()));
  }
  return value;
}

TensorDict load_pt(const std::string& path) {
  const c10::IValue value = load_pt_object(path);
  if (!value.isGenericDict()) {
    throw IoError(fmt::format("{}: holds a {}, not a dict of tensors", path, value.tagKind()));
  }
  TensorDict tensors;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString()) {
      throw IoError(fmt::format("{}: a key is a {}, not a string", path, item.key().tagKind()));
    }
    const std::string key = item.key().toStringRef();
    if (!item.value().isTensor()) {
      throw IoError(fmt::format("{}: the value of '{}' is a {}, not a tensor", path, key, item.value().tagKind()));
    }
    tensors.insert(key, item.value().toTensor());
  }
  return tensors;
}

LoadReport load_pt(torch::nn::Module& module, const std::string& path, const LoadOptions& options) {
  return load_state_dict(module, load_pt(path), options, path);
}

}  // namespace trainkit::io
