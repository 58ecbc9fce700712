#pragma once
/// @file
/// Reference models (CNN, MLP, ResNets), activation checkpointing, initialization.
#include "trainkit/nn/checkpoint.h"
#include "trainkit/nn/init.h"
#include "trainkit/nn/models.h"
#include "trainkit/nn/resnet.h"
