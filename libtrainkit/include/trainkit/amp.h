#pragma once
/// @file
/// Mixed precision: an RAII autocast region and a dynamic loss scaler, with PyTorch's semantics.
#include "trainkit/amp/autocast.h"
#include "trainkit/amp/grad_scaler.h"
