#pragma once
/// @file
/// One fuzz harness source builds two ways:
/// - with TRAINKIT_LIBFUZZER defined (scripts/fuzz.sh, clang -fsanitize=fuzzer): the harness is the
///   program's `LLVMFuzzerTestOneInput`, one executable per target; a source holding several targets
///   guards each with `#if !defined(TRAINKIT_LIBFUZZER) || defined(TRAINKIT_FUZZ_<name>)`, and the fuzz
///   build defines TRAINKIT_FUZZ_<name> for target <name>;
/// - without it (every build): the harness registers itself by name, and `trainkit_fuzz_replay` runs
///   every registered target over its committed corpus and regression inputs (ctest `fuzz_replay`).
///
/// A harness returns normally for any input that trainkit handles: accepted, or rejected with the error
/// type its API documents. Anything else (a crash, a sanitizer report, another exception escaping, a
/// hang) is a finding.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace trainkit::fuzz {

/// A harness: one input, return value ignored (libFuzzer's convention: 0).
using Target = int (*)(const uint8_t* data, size_t size);

/// Registers `target` under `name` for the replay driver; returns true (to initialize a static).
bool register_target(const char* name, Target target);

/// Writes `size` bytes to a scratch file of this process (one per `slot`) and returns its path; the
/// readers under test take paths. The file is rewritten for every input.
std::string scratch_file(const uint8_t* data, size_t size, const std::string& slot = "input");

/// A broken invariant of an accepted input: prints `what` and aborts (a finding, as a crash is).
[[noreturn]] void fail(const std::string& what);

/// Appends the low `bytes` bytes of `value`, little-endian.
inline void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

/// The file of a harness whose first input byte picks the mode: odd, the rest of the input is the file as
/// it is (the raw framing checks); even, `wrap(rest, rest_size)` puts the rest in a valid frame, so that the
/// fuzzer reaches the checks behind the framing. std::nullopt for an empty input or a refused wrap.
template <class Wrap>
std::optional<std::string> raw_or_wrapped(const uint8_t* data, size_t size, Wrap wrap) {
  if (size == 0) {
    return std::nullopt;
  }
  if ((data[0] & 1) != 0) {
    return std::string(reinterpret_cast<const char*>(data + 1), size - 1);
  }
  return wrap(data + 1, size - 1);
}

/// fail(what) unless `ok`.
inline void check(bool ok, const std::string& what) {
  if (!ok) {
    fail(what);
  }
}

}  // namespace trainkit::fuzz

#ifdef TRAINKIT_LIBFUZZER
#define TRAINKIT_FUZZ_TARGET(name) extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
#else
#define TRAINKIT_FUZZ_TARGET(name)                                                                  \
  static int trainkit_fuzz_##name(const uint8_t* data, size_t size);                                \
  [[maybe_unused]] static const bool trainkit_fuzz_registered_##name =                              \
      ::trainkit::fuzz::register_target(#name, trainkit_fuzz_##name);                               \
  static int trainkit_fuzz_##name(const uint8_t* data, size_t size)
#endif
