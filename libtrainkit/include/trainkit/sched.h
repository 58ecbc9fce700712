#pragma once
/// @file
/// LR schedulers that drive any torch::optim::Optimizer, with PyTorch's semantics.
#include "trainkit/sched/compose.h"
#include "trainkit/sched/cosine.h"
#include "trainkit/sched/cyclic.h"
#include "trainkit/sched/factor.h"
#include "trainkit/sched/factory.h"
#include "trainkit/sched/plateau.h"
#include "trainkit/sched/scheduler.h"
#include "trainkit/sched/warmup_decay.h"
