#pragma once
/// @file
/// Training: Trainer and hooks, checkpoints, the config and the `trainkit train` job.
#include "trainkit/train/callbacks.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/trainer.h"
