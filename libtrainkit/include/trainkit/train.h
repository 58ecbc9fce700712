#pragma once
/// @file
/// Training: the task (forward and loss over a batch), metrics, Trainer and hooks, checkpoints.
#include "trainkit/train/callbacks.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/metric.h"
#include "trainkit/train/task.h"
#include "trainkit/train/trainer.h"
