#pragma once
/// @file
/// Data: batches and batch sources (preloaded tensors, torch::data loaders, callables), IDX readers.
#include "trainkit/data/batch.h"
#include "trainkit/data/batch_source.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/data/torch_data.h"
