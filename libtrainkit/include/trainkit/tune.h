#pragma once
/// @file
/// Tuning: the LR range test and its suggestions.
#include "trainkit/tune/lr_finder.h"
