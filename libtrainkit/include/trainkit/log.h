#pragma once
/// @file
/// Monitoring: metrics files and console progress.
#include "trainkit/log/metrics.h"
#include "trainkit/log/progress.h"
