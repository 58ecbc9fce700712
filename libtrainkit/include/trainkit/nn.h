#pragma once
/// @file
/// Reference models, activation checkpointing, initialization.
#include "trainkit/nn/checkpoint.h"
#include "trainkit/nn/init.h"
#include "trainkit/nn/models.h"
