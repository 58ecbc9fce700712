// Fuzz target `checkpoint`: train::load_checkpoint and train::digest_checkpoint over a file. The first
// input byte picks what the rest is: odd = the whole file, raw (header checks, CRC); even = the payload
// only, wrapped in a valid header with the right size and CRC-32, so that the fuzzer reaches the archive
// reader behind the checks.

#include <zlib.h>

#include <string>

#include <torch/serialize/input-archive.h>

#include "fuzz_target.h"
#include "trainkit/train/checkpoint.h"

TRAINKIT_FUZZ_TARGET(checkpoint) {
  const std::optional<std::string> file =
      trainkit::fuzz::raw_or_wrapped(data, size, [](const uint8_t* payload, size_t n) -> std::optional<std::string> {
        std::string framed = "TKCKPT\r\n";
        trainkit::fuzz::put_le(framed, trainkit::train::kCheckpointFormatVersion, 4);
        trainkit::fuzz::put_le(framed, 0, 4);
        trainkit::fuzz::put_le(framed, n, 8);
        trainkit::fuzz::put_le(framed, crc32(crc32(0L, Z_NULL, 0), payload, static_cast<uInt>(n)), 4);
        trainkit::fuzz::put_le(framed, 0, 4);
        framed.append(reinterpret_cast<const char*>(payload), n);
        return framed;
      });
  if (!file) {
    return 0;
  }
  const std::string path =
      trainkit::fuzz::scratch_file(reinterpret_cast<const uint8_t*>(file->data()), file->size(), "checkpoint");
  try {
    torch::serialize::InputArchive archive;
    trainkit::train::load_checkpoint(path, archive);
    trainkit::train::digest_checkpoint(path);
  } catch (const trainkit::train::CheckpointError&) {
  }
  return 0;
}
