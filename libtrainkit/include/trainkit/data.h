#pragma once
/// @file
/// Data: IDX readers and the preloaded-tensor loader.
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
