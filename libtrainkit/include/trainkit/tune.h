#pragma once
/// @file
/// Tuning: the LR range test and its suggestions; the batch-size finder; hyperparameter search (search
/// spaces, Sobol design, Gaussian process, acquisitions, samplers (GP, TPE, random), pruners (median,
/// successive halving, Hyperband), ask/tell study, kept in Optuna's journal file).
#include "trainkit/tune/acquisition.h"
#include "trainkit/tune/batch_size_finder.h"
#include "trainkit/tune/gaussian_process.h"
#include "trainkit/tune/hyperband.h"
#include "trainkit/tune/journal_file.h"
#include "trainkit/tune/lr_finder.h"
#include "trainkit/tune/optuna_journal.h"
#include "trainkit/tune/pruner.h"
#include "trainkit/tune/sampler.h"
#include "trainkit/tune/search_space.h"
#include "trainkit/tune/sobol.h"
#include "trainkit/tune/study.h"
#include "trainkit/tune/tpe_sampler.h"
#include "trainkit/tune/trial.h"
