#pragma once
// The library's one way to reject a caller's argument (the error policy in trainkit/args.h):
// std::invalid_argument whose message names the argument and echoes the value. The message is formatted
// only when the check fails.

#include <stdexcept>

#include <fmt/format.h>

/// Throws std::invalid_argument(fmt::format(...)) unless `cond`.
#define TRAINKIT_CHECK_ARG(cond, ...)                               \
  do {                                                              \
    if (!(cond)) {                                                  \
      throw std::invalid_argument(fmt::format(__VA_ARGS__));        \
    }                                                               \
  } while (false)
