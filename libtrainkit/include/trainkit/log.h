#pragma once
/// @file
/// Monitoring: metrics files, console progress and SVG plots.
#include "trainkit/log/metrics.h"
#include "trainkit/log/progress.h"
#include "trainkit/log/summary_writer.h"
#include "trainkit/log/svg_plot.h"
