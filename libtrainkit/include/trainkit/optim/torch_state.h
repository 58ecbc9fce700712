#pragma once
/// @file
/// Python's optimizer state in trainkit's optimizers: the file `torch.save(opt.state_dict(), path)` writes,
/// loaded into the trainkit optimizer of the same kind over the same parameters (in the order of Python's
/// param groups), so that a C++ port continues a Python run where it stopped.
///
///     trainkit::optim::Adam opt(groups, trainkit::optim::AdamOptions(1e-3));
///     trainkit::optim::load_torch_state(opt, "optimizer.pt");   // Python: torch.save(opt.state_dict(), ...)

#include <string>

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

namespace trainkit::optim {

/// Reads `path` (a torch.save file of a torch.optim state_dict: {'state': {id: {key: tensor or number}},
/// 'param_groups': [{'params': [ids], 'lr': ..., ...}]}) into `optimizer`, one of Adam, AdamW, Sgd, RAdam,
/// NAdam, Adamax, Adagrad, Adadelta, Asgd, Rprop. Each param group's keys go into its options through the
/// options binding (the keys of docs/config.md); 'foreach', 'fused', 'differentiable', 'capturable' and
/// 'initial_lr' are ignored, and Adam/AdamW's 'decoupled_weight_decay' must be false/true. Each parameter's
/// state keys (torch.optim's names) replace its state; a parameter without state in the file has none after.
/// Throws std::invalid_argument naming the file, the param group, the parameter and the key for: another
/// number of param groups or of parameters in a group, an unknown or missing key, a value of the wrong kind,
/// a state tensor whose shape is not its parameter's or whose dtype is neither the parameter's nor its state
/// dtype, options the optimizer refuses; io::IoError for an unreadable file. On error `optimizer` is unchanged.
void load_torch_state(torch::optim::Optimizer& optimizer, const std::string& path);

/// load_torch_state() from a state_dict already read (e.g. by io::load_pt_object); `source` names it in messages.
void load_torch_state(torch::optim::Optimizer& optimizer, const c10::IValue& state_dict, const std::string& source);

}  // namespace trainkit::optim
