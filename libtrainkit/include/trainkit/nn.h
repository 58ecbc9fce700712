#pragma once
/// @file
/// Reference models.
#include "trainkit/nn/models.h"
