#pragma once
/// @file
/// Gradient clipping and accumulation.
#include "trainkit/grad/accumulation.h"
#include "trainkit/grad/clip.h"
