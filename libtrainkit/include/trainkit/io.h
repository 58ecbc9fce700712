#pragma once
/// @file
/// Weights across the C++/Python border: safetensors and PyTorch `torch.save` files, loaded by name.
#include "trainkit/io/export.h"
#include "trainkit/io/safetensors.h"
#include "trainkit/io/state_dict.h"
#include "trainkit/io/torch_save.h"
