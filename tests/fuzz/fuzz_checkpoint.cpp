// Fuzz target `checkpoint`: train::load_checkpoint and train::digest_checkpoint over a file. The first
// input byte picks what the rest is: odd = the whole file, raw (header checks, CRC); even = the payload
// only, wrapped in a valid header with the right size and CRC-32, so that the fuzzer reaches the archive
// reader behind the checks.

#include <zlib.h>

#include <string>

#include <torch/serialize/input-archive.h>

#include "fuzz_target.h"
#include "trainkit/train/checkpoint.h"

namespace {

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

}  // namespace

TRAINKIT_FUZZ_TARGET(checkpoint) {
  if (size == 0) {
    return 0;
  }
  std::string file;
  if ((data[0] & 1) != 0) {
    file.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  } else {
    const uInt n = static_cast<uInt>(size - 1);
    file = "TKCKPT\r\n";
    put_le(file, trainkit::train::kCheckpointFormatVersion, 4);
    put_le(file, 0, 4);
    put_le(file, n, 8);
    put_le(file, crc32(crc32(0L, Z_NULL, 0), data + 1, n), 4);
    put_le(file, 0, 4);
    file.append(reinterpret_cast<const char*>(data + 1), n);
  }
  const std::string path =
      trainkit::fuzz::scratch_file(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "checkpoint");
  try {
    torch::serialize::InputArchive archive;
    trainkit::train::load_checkpoint(path, archive);
    trainkit::train::digest_checkpoint(path);
  } catch (const trainkit::train::CheckpointError&) {
  }
  return 0;
}
