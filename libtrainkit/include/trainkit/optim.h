#pragma once
/// @file
/// trainkit::optim: Adam/AdamW, RAdam, NAdam, Adamax, SGD, LARS and LAMB as torch::optim::Optimizer subclasses,
/// each with a fused single-pass CPU kernel and an ATen reference path, and the factory that builds them by name.
/// trainkit::optim: Adam/AdamW, SGD, LARS and LAMB as torch::optim::Optimizer subclasses, each with a fused
/// single-pass CPU kernel and an ATen reference path, Adagrad (fused too), Adadelta, ASGD and Rprop, and the
/// factory that builds them by name.

#include "trainkit/optim/adam.h"
#include "trainkit/optim/cyclable_momentum.h"
#include "trainkit/optim/factory.h"
#include "trainkit/optim/lamb.h"
#include "trainkit/optim/lars.h"
#include "trainkit/optim/optimizer_base.h"
#include "trainkit/optim/param_groups.h"
#include "trainkit/optim/scaled_step.h"
#include "trainkit/optim/sgd.h"
// RAdam, NAdam and Adamax (torch.optim's Adam variants)
#include "trainkit/optim/adamax.h"
#include "trainkit/optim/moment_fields.h"
#include "trainkit/optim/nadam.h"
#include "trainkit/optim/radam.h"

// timm's Lion and Adafactor.
#include "trainkit/optim/adafactor.h"
#include "trainkit/optim/lion.h"
// The rest of torch.optim: Adagrad (fused), Adadelta, ASGD, Rprop.
#include "trainkit/optim/adadelta.h"
#include "trainkit/optim/adagrad.h"
#include "trainkit/optim/asgd.h"
#include "trainkit/optim/rprop.h"
// Python torch.optim state_dict files loaded into these optimizers.
#include "trainkit/optim/torch_state.h"
// Optimizer state and step on the host for parameters on a device (ZeRO-Offload).
#include "trainkit/optim/offload.h"
