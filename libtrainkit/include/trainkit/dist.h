#pragma once
/// @file
/// Distributed training on c10d: process groups, DistributedDataParallel, ZeRO stages 1-3 (zero.h, fully_shard.h), the launcher, and
/// GPipe-style model parallelism
/// (built when trainkit is configured with TRAINKIT_WITH_DISTRIBUTED, the default).
#include "trainkit/dist/backend.h"
#include "trainkit/dist/checkpoint_group.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/fully_shard.h"
#include "trainkit/dist/launch.h"
#include "trainkit/dist/pipeline.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/dist/zero.h"
