#pragma once
/// @file
/// The targets registered by the harnesses of this build (replay driver only).

#include <map>
#include <string>

#include "fuzz_target.h"

namespace trainkit::fuzz {

/// Every registered target by name.
std::map<std::string, Target>& registry();

}  // namespace trainkit::fuzz
