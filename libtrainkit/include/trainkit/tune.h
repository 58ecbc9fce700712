#pragma once
/// @file
/// Tuning: the LR range test and its suggestions; the batch-size finder.
#include "trainkit/tune/batch_size_finder.h"
#include "trainkit/tune/lr_finder.h"
