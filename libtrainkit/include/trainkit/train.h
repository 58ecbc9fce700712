#pragma once
/// @file
/// Training: the task (forward and loss over a batch), metrics, Trainer and hooks, checkpoints,
/// early stopping, best-k weights, EMA and SWA, model summaries, step-time profiles, profiler traces and per-layer norms.
#include "trainkit/train/callbacks.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/early_stopping.h"
#include "trainkit/train/layer_norms.h"
#include "trainkit/train/ema.h"
#include "trainkit/train/metric.h"
#include "trainkit/train/model_checkpoint.h"
#include "trainkit/train/profiler_trace.h"
#include "trainkit/train/step_times.h"
#include "trainkit/train/summary.h"
#include "trainkit/train/swa.h"
#include "trainkit/train/task.h"
#include "trainkit/train/trainer.h"
