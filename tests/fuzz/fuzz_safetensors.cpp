// Fuzz target `safetensors`: io::load_safetensors over a file. The first input byte picks what the rest
// is: odd = the whole file, raw (length field, header bounds); even = a 2-byte little-endian data length L
// and then the header's JSON, wrapped with its right length and followed by L data bytes (0 and 1, valid
// for every dtype), so that the fuzzer reaches the entry and offset checks behind the framing. An accepted
// file is read in full and written back with save_safetensors, which must read back the same.

#include <string>

#include <torch/torch.h>

#include "fuzz_target.h"
#include "trainkit/io/safetensors.h"

namespace {

std::string raw_bytes(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {static_cast<const char*>(c.const_data_ptr()), c.nbytes()};
}

}  // namespace

TRAINKIT_FUZZ_TARGET(safetensors) {
  const std::optional<std::string> file =
      trainkit::fuzz::raw_or_wrapped(data, size, [](const uint8_t* rest, size_t n) -> std::optional<std::string> {
        if (n < 2) {
          return std::nullopt;
        }
        const size_t data_length = rest[0] | (static_cast<size_t>(rest[1]) << 8);
        std::string framed;
        trainkit::fuzz::put_le(framed, n - 2, 8);
        framed.append(reinterpret_cast<const char*>(rest + 2), n - 2);
        for (size_t i = 0; i < data_length; ++i) {
          framed.push_back(static_cast<char>(i & 1));
        }
        return framed;
      });
  if (!file) {
    return 0;
  }
  const std::string path =
      trainkit::fuzz::scratch_file(reinterpret_cast<const uint8_t*>(file->data()), file->size(), "safetensors");
  trainkit::io::SafetensorsFile loaded;
  try {
    loaded = trainkit::io::load_safetensors(path);
  } catch (const trainkit::io::IoError&) {
    return 0;
  }
  size_t bytes = 0;
  for (const auto& item : loaded.tensors) {
    bytes += raw_bytes(item.value()).size();
  }
  trainkit::fuzz::check(bytes <= file->size(), "accepted tensors hold more bytes than the file");
  const std::string again = trainkit::fuzz::scratch_file(nullptr, 0, "safetensors-again");
  trainkit::io::save_safetensors(again, loaded.tensors, loaded.metadata);
  const trainkit::io::SafetensorsFile reread = trainkit::io::load_safetensors(again);
  trainkit::fuzz::check(reread.metadata == loaded.metadata, "metadata changed by a write and a read");
  trainkit::fuzz::check(reread.tensors.size() == loaded.tensors.size(), "tensor count changed by a write and a read");
  for (const auto& item : loaded.tensors) {
    const at::Tensor* t = reread.tensors.find(item.key());
    trainkit::fuzz::check(t != nullptr && t->sizes() == item.value().sizes() &&
                              t->scalar_type() == item.value().scalar_type() &&
                              raw_bytes(*t) == raw_bytes(item.value()),
                          "tensor '" + item.key() + "' changed by a write and a read");
  }
  return 0;
}
