#pragma once
/// @file
/// Umbrella header: everything in trainkit.
#include "trainkit/amp.h"
#include "trainkit/compat.h"
#include "trainkit/data.h"
#include "trainkit/features.h"
#if TRAINKIT_WITH_DISTRIBUTED
#include "trainkit/dist.h"
#endif
#include "trainkit/grad.h"
#include "trainkit/io.h"
#include "trainkit/log.h"
#include "trainkit/nn.h"
#include "trainkit/optim.h"
#include "trainkit/sched.h"
#include "trainkit/subprocess.h"
#include "trainkit/train.h"
#include "trainkit/tune.h"
#include "trainkit/version.h"
