#pragma once
/// @file
/// Training: the task (forward and loss over a batch), metrics, Trainer and its Callback interface,
/// checkpoints, EMA and SWA averaging, model summaries, step-time profiles, host memory kept for reuse,
/// and every ready-made callback.
#include "trainkit/train/callback.h"
#include "trainkit/train/callbacks/early_stopping.h"
#include "trainkit/train/callbacks/ema_weight_averaging.h"
#include "trainkit/train/callbacks/metrics_logger.h"
#include "trainkit/train/callbacks/model_checkpoint.h"
#include "trainkit/train/callbacks/norm_monitor.h"
#include "trainkit/train/callbacks/profiler_trace.h"
#include "trainkit/train/callbacks/stochastic_weight_averaging.h"
#include "trainkit/train/callbacks/trainer_checkpoint.h"
#include "trainkit/train/checkpoint.h"
#include "trainkit/train/ema.h"
#include "trainkit/train/host_memory.h"
#include "trainkit/train/metric.h"
#include "trainkit/train/step_times.h"
#include "trainkit/train/summary.h"
#include "trainkit/train/swa.h"
#include "trainkit/train/task.h"
#include "trainkit/train/trainer.h"
