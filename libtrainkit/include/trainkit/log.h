#pragma once
/// @file
/// Monitoring: metrics files, console progress, TensorBoard, MLflow tracking and SVG plots.
#include "trainkit/log/metrics.h"
#include "trainkit/log/mlflow.h"
#include "trainkit/log/progress.h"
#include "trainkit/log/summary_writer.h"
#include "trainkit/log/svg_plot.h"
