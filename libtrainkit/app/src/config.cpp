#include "trainkit/app/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trainkit/amp/grad_scaler.h"
#include "trainkit/app/toml_args.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/nn/init.h"
#include "trainkit/nn/models.h"

#include "trainkit/train/callbacks/early_stopping.h"
#include "trainkit/train/callbacks/model_checkpoint.h"
#include "trainkit/train/callbacks/profiler_trace.h"
#include "trainkit/train/callbacks/stochastic_weight_averaging.h"
#include "trainkit/train/ema.h"
#include "trainkit/train/metric.h"
#include "trainkit/train/trainer.h"

namespace trainkit::app {
namespace {

/// Where a value came from, for error messages: "FILE: section.key" or "--set section.key=...".
using Where = std::string;

[[noreturn]] void fail(const Where& where, const std::string& expected, const ArgValue& value) {
  const std::string line = value.line() > 0 ? fmt::format(" (line {})", value.line()) : "";
  throw ConfigError(fmt::format("{}: expected {}, got {}{}", where, expected, value.to_string(), line));
}

constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

/// A CIFAR ResNet depth: 6n + 2 with n >= 1.
int64_t as_resnet_depth(const ArgValue& n, const Where& w);

int64_t as_int(const ArgValue& n, const Where& w, int64_t lo, int64_t hi = kNoMax) {
  const std::string expected = hi == kNoMax ? fmt::format("an integer >= {}", lo)
                                            : fmt::format("an integer in [{}, {}]", lo, hi);
  const auto* v = n.get_if<int64_t>();
  if (v == nullptr || *v < lo || *v > hi) {
    fail(w, expected, n);
  }
  return *v;
}

int64_t as_resnet_depth(const ArgValue& n, const Where& w) {
  const auto* v = n.get_if<int64_t>();
  if (v == nullptr || *v < 8 || (*v - 2) % 6 != 0) {
    fail(w, "an integer 6n + 2 (20, 32, 44, 56, 110)", n);
  }
  return *v;
}

/// A float (integers accepted) in [lo, hi], or (lo, hi] when `lo_open`, or [lo, hi) when `hi_open`.
double as_float(const ArgValue& n, const Where& w, double lo, double hi, bool lo_open = false,
                bool hi_open = false) {
  std::string expected = "a number";
  if (std::isfinite(lo) && std::isfinite(hi)) {
    expected = fmt::format("a number in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  } else if (std::isfinite(lo)) {
    expected = fmt::format("a number {} {}", lo_open ? ">" : ">=", lo);
  }
  const auto x = n.as_number();
  const bool ok = x && std::isfinite(*x) && (lo_open ? *x > lo : *x >= lo) && (hi_open ? *x < hi : *x <= hi);
  if (!ok) {
    fail(w, expected, n);
  }
  return *x;
}

double as_norm_type(const ArgValue& n, const Where& w) {
  if (const auto* f = n.get_if<double>(); f != nullptr && std::isinf(*f) && *f > 0) {
    return *f;
  }
  return as_float(n, w, 0.0, kInf, true);
}

bool as_bool(const ArgValue& n, const Where& w) {
  const auto* v = n.get_if<bool>();
  if (v == nullptr) {
    fail(w, "true or false", n);
  }
  return *v;
}

std::string as_string(const ArgValue& n, const Where& w) {
  const auto* v = n.get_if<std::string>();
  if (v == nullptr) {
    fail(w, "a string", n);
  }
  return *v;
}

std::string as_choice(const ArgValue& n, const Where& w, const std::vector<std::string>& choices) {
  const auto* v = n.get_if<std::string>();
  const std::string expected = fmt::format("one of \"{}\"", fmt::join(choices, "\", \""));
  if (v == nullptr || std::find(choices.begin(), choices.end(), *v) == choices.end()) {
    fail(w, expected, n);
  }
  return *v;
}

// An array of distinct strings, each one of `choices`.
std::vector<std::string> as_choice_list(const ArgValue& n, const Where& w, const std::vector<std::string>& choices) {
  const auto* a = n.get_if<ArgValue::Array>();
  const std::string expected = fmt::format("an array of distinct values of \"{}\"", fmt::join(choices, "\", \""));
  if (a == nullptr) {
    fail(w, expected, n);
  }
  std::vector<std::string> out;
  for (const auto& e : *a) {
    const auto* v = e.get_if<std::string>();
    if (v == nullptr || std::find(choices.begin(), choices.end(), *v) == choices.end() ||
        std::find(out.begin(), out.end(), *v) != out.end()) {
      fail(w, expected, n);
    }
    out.push_back(*v);
  }
  return out;
}

// "auto", "cpu", "cuda" or "cuda:<index>" (index a non-negative integer).
std::string as_device(const ArgValue& n, const Where& w) {
  const auto* v = n.get_if<std::string>();
  const auto is_index = [](const std::string& digits) {
    return !digits.empty() && digits.size() < 6 && std::all_of(digits.begin(), digits.end(), ::isdigit);
  };
  if (v == nullptr || !(*v == "auto" || *v == "cpu" || *v == "cuda" || (v->rfind("cuda:", 0) == 0 && is_index(v->substr(5))))) {
    fail(w, "\"auto\", \"cpu\", \"cuda\" or \"cuda:<index>\"", n);
  }
  return *v;
}

std::vector<int64_t> as_positive_ints(const ArgValue& n, const Where& w) {
  const auto* a = n.get_if<ArgValue::Array>();
  const std::string expected = "a non-empty array of integers >= 1";
  if (a == nullptr || a->empty()) {
    fail(w, expected, n);
  }
  std::vector<int64_t> out;
  for (const auto& e : *a) {
    const auto* i = e.get_if<int64_t>();
    if (i == nullptr || *i < 1) {
      fail(w, expected, n);
    }
    out.push_back(*i);
  }
  return out;
}

std::vector<std::string> as_metric_names(const ArgValue& n, const Where& w) {
  const auto* a = n.get_if<ArgValue::Array>();
  const std::string expected = "an array of metric names (\"accuracy\", \"top<k>_accuracy\", \"mae\", \"mse\")";
  if (a == nullptr) {
    fail(w, expected, n);
  }
  std::vector<std::string> out;
  for (const auto& e : *a) {
    const auto* name = e.get_if<std::string>();
    if (name == nullptr) {
      fail(w, expected, n);
    }
    try {
      (void)train::make_metric(*name);
    } catch (const std::invalid_argument& error) {
      throw ConfigError(fmt::format("{}: {}", w, error.what()));
    }
    if (std::find(out.begin(), out.end(), *name) != out.end()) {
      throw ConfigError(fmt::format("{}: metric \"{}\" named twice", w, *name));
    }
    out.push_back(*name);
  }
  return out;
}

std::string as_monitor(const ArgValue& n, const Where& w) {
  const std::string v = as_string(n, w);
  if (v != "train/loss" && v.rfind("val/", 0) != 0) {
    fail(w, "\"train/loss\" or \"val/loss\" or \"val/<metric>\"", n);
  }
  return v;
}

/// A name of the epoch's metrics that hooks can monitor.
std::string as_epoch_monitor(const ArgValue& n, const Where& w) {
  const std::string v = as_string(n, w);
  if (v != "train/loss" && v.rfind("val/", 0) != 0 && v.rfind("val_ema/", 0) != 0) {
    fail(w, "\"train/loss\" or \"val/<loss or metric>\" or \"val_ema/<loss or metric>\"", n);
  }
  return v;
}

// TOML literals for the effective config.
std::string lit(int64_t v) { return ArgValue(v).to_string(); }
std::string lit(bool v) { return ArgValue(v).to_string(); }
std::string lit(double v) { return ArgValue(v).to_string(); }
std::string lit(const std::string& v) { return ArgValue(v).to_string(); }
std::string lit(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }
std::string lit(const std::vector<std::string>& v) {
  std::vector<std::string> items;
  for (const auto& s : v) {
    items.push_back(lit(s));
  }
  return fmt::format("[{}]", fmt::join(items, ", "));
}

/// One documented key of the plain sections: how to read it into a Config and how to print it back.
struct Key {
  std::string section;
  std::string name;
  std::string type;
  std::string doc;
  std::function<void(Config&, const ArgValue&, const Where&)> read;
  std::function<std::string(const Config&)> show;
};

// Each key is written once: section, member, type text, doc and the expression that reads `n` at `w`.
#define TRAINKIT_KEY(section, member, type, doc, expr)                                              \
  Key {                                                                                             \
    #section, #member, type, doc,                                                                   \
        [](Config& c, const ArgValue& n, const Where& w) { c.section.member = (expr); },           \
        [](const Config& c) { return lit(c.section.member); }                                       \
  }

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      TRAINKIT_KEY(data, dataset, "\"fashion-mnist\" or \"cifar10\"",
                   "Image format in data.dir: MNIST-style (gzip'd) IDX files (1x28x28), or CIFAR-10's binary batches "
                   "data_batch_1..5.bin and test_batch.bin (3x32x32)",
                   as_choice(n, w, {"fashion-mnist", "cifar10"})),
      TRAINKIT_KEY(data, dir, "string", "Directory with the data set's files (see data.dataset)", as_string(n, w)),
      TRAINKIT_KEY(data, val_size, "integer >= 0",
                   "Training examples held out (from the end of the training file) for validation",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(data, limit_train, "integer >= 0", "Use only the first N training examples (0 = all)",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(data, limit_test, "integer >= 0", "Use only the first N test examples (0 = all)",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(data, workers, "integer >= 0",
                   "Loader worker threads preparing training batches (0 = in the training thread)", as_int(n, w, 0)),
      TRAINKIT_KEY(data, normalize_on_device, "boolean",
                   "Keep images as uint8 on the host and normalize each batch on the training device (4x fewer "
                   "bytes moved)",
                   as_bool(n, w)),
      TRAINKIT_KEY(data, crop_padding, "integer >= 0",
                   "Training augmentation: random crop after zero-padding each side by N pixels (0 = off)",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(data, horizontal_flip, "boolean", "Training augmentation: random horizontal flip (p = 0.5)",
                   as_bool(n, w)),
      TRAINKIT_KEY(model, name, "\"cnn\" or \"mlp\" or \"resnet\" or \"resnet18\"",
                   "Network: conv blocks + MLP head, a plain MLP, He et al.'s CIFAR ResNet of model.depth layers, or "
                   "ResNet-18 with a small-image stem",
                   as_choice(n, w, {"cnn", "mlp", "resnet", "resnet18"})),
      TRAINKIT_KEY(model, depth, "integer 6n + 2", "resnet: layers (20, 32, 44, 56, 110)", as_resnet_depth(n, w)),
      TRAINKIT_KEY(model, zero_init_residual, "boolean",
                   "resnet, resnet18: start each residual branch's last BatchNorm at 0", as_bool(n, w)),
      TRAINKIT_KEY(model, channels, "array of integers >= 1",
                   "cnn: output channels of each 3x3 conv block (each halves the resolution)",
                   as_positive_ints(n, w)),
      TRAINKIT_KEY(model, hidden, "integer >= 1", "Width of the hidden fully connected layer",
                   as_int(n, w, 1)),
      TRAINKIT_KEY(model, dropout, "number in [0, 1)", "Dropout before each fully connected layer",
                   as_float(n, w, 0.0, 1.0, false, true)),
      TRAINKIT_KEY(model, batch_norm, "boolean", "cnn: batch normalization after each convolution",
                   as_bool(n, w)),
      TRAINKIT_KEY(model, checkpoint_segments, "integer >= 0",
                   "Activation checkpointing: train with nn::checkpoint_sequential in this many segments, "
                   "recomputing all but the last in backward (0 = off; at most the number of modules)",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(model, init, "\"default\" or \"kaiming_normal\" or \"kaiming_uniform\" or \"xavier_normal\" or "
                   "\"xavier_uniform\" or \"lecun_normal\"",
                   "Weight initialization (nn::init::scheme): default is LibTorch's; the others set Linear/Conv "
                   "weights by their formula, biases 0, BatchNorm weight 1",
                   as_choice(n, w, nn::init::scheme_names())),
      TRAINKIT_KEY(train, epochs, "integer >= 1", "Passes over the training set", as_int(n, w, 1)),
      TRAINKIT_KEY(train, batch_size, "integer >= 1", "Training batch size (per rank when distributed)",
                   as_int(n, w, 1)),
      TRAINKIT_KEY(train, eval_batch_size, "integer >= 1", "Batch size for validation and test",
                   as_int(n, w, 1)),
      TRAINKIT_KEY(train, seed, "integer >= 0", "Seed of initialization, dropout and data order",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(train, max_steps, "integer >= 0", "Stop after this many optimizer steps (0 = no limit)",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(train, threads, "integer >= 0", "Intra-op threads (0 = LibTorch's default)",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(train, device, "\"auto\", \"cpu\", \"cuda\" or \"cuda:<index>\"",
                   "Device to train on. cuda: one GPU per rank, cuda:<LOCAL_RANK> under a launcher (cuda:0 alone); "
                   "cuda:<index>: that GPU (single-process runs only); auto: as cuda when a GPU is present, else the CPU",
                   as_device(n, w)),
      TRAINKIT_KEY(train, metrics, "array of strings",
                   "Metrics evaluated besides the loss: \"accuracy\", \"top<k>_accuracy\", \"mae\", \"mse\"",
                   as_metric_names(n, w)),
      TRAINKIT_KEY(train, monitor, "string",
                   "What a metric-driven scheduler (reduce_on_plateau) watches: \"val/loss\", \"val/<metric>\" "
                   "or \"train/loss\"",
                   as_monitor(n, w)),
      TRAINKIT_KEY(grad, accumulation_steps, "integer >= 1",
                   "Micro-batches (of train.batch_size) accumulated into one optimizer step", as_int(n, w, 1)),
      TRAINKIT_KEY(grad, clip_norm, "number >= 0", "Clip the total gradient norm to this (0 = off)",
                   as_float(n, w, 0.0, kInf)),
      TRAINKIT_KEY(grad, norm_type, "number > 0 or inf", "Order of the clipped norm", as_norm_type(n, w)),
      TRAINKIT_KEY(grad, clip_value, "number >= 0", "Clamp gradient elements to [-v, v] (0 = off)",
                   as_float(n, w, 0.0, kInf)),
      TRAINKIT_KEY(amp, enabled, "boolean", "Run forward passes under autocast (mixed precision)", as_bool(n, w)),
      TRAINKIT_KEY(amp, dtype, "\"bfloat16\" or \"float16\"",
                   "Autocast dtype (CPU: bfloat16, float16; CUDA: both)", as_choice(n, w, {"bfloat16", "float16"})),
      TRAINKIT_KEY(amp, grad_scaler, "boolean", "Scale the loss with a GradScaler (for float16)", as_bool(n, w)),
      TRAINKIT_KEY(amp, init_scale, "number > 0", "GradScaler's initial scale", as_float(n, w, 0.0, kInf, true)),
      TRAINKIT_KEY(amp, growth_interval, "integer >= 1", "GradScaler: clean steps before the scale grows",
                   as_int(n, w, 1)),
      TRAINKIT_KEY(checkpoint, every_steps, "integer >= 0",
                   "Also checkpoint every N steps (0 = only at epoch ends and at the end)", as_int(n, w, 0)),
      TRAINKIT_KEY(checkpoint, keep_last, "integer >= 1", "Checkpoints kept; older ones are deleted",
                   as_int(n, w, 1)),
      TRAINKIT_KEY(checkpoint, save_top_k, "integer >= -1",
                   "Keep the best K models by checkpoint.monitor as weights-only files in <run>/best/ that "
                   "torch::load reads (0 = off, -1 = every epoch's)",
                   as_int(n, w, -1)),
      TRAINKIT_KEY(checkpoint, monitor, "string", "The metric ranking the best models (\"val/loss\", "
                   "\"val/<metric>\", \"val_ema/<loss or metric>\", \"train/loss\")", as_epoch_monitor(n, w)),
      TRAINKIT_KEY(checkpoint, mode, "\"min\" or \"max\"", "Whether lower or higher checkpoint.monitor is better",
                   as_choice(n, w, {"min", "max"})),
      TRAINKIT_KEY(checkpoint, save_last, "boolean", "Also write <run>/best/last.pt (weights only) every epoch",
                   as_bool(n, w)),
      Key{"checkpoint", "export", "array of \"safetensors\", \"state_dict\"",
          "Interchange copies of the final weights (<run>/model.*) and of the EMA and SWA weights (ema.*, swa.*) "
          "that Python reads: safetensors (.safetensors) and torch.save state_dicts (.pth, torch.load with "
          "weights_only=True)",
          [](Config& c, const ArgValue& n, const Where& w) {
            c.checkpoint.export_formats = as_choice_list(n, w, {"safetensors", "state_dict"});
          },
          [](const Config& c) { return lit(c.checkpoint.export_formats); }},
      TRAINKIT_KEY(early_stopping, enabled, "boolean", "Stop when early_stopping.monitor stops improving",
                   as_bool(n, w)),
      TRAINKIT_KEY(early_stopping, monitor, "string", "The watched metric (as checkpoint.monitor)",
                   as_epoch_monitor(n, w)),
      TRAINKIT_KEY(early_stopping, mode, "\"min\" or \"max\"", "Whether lower or higher is better",
                   as_choice(n, w, {"min", "max"})),
      TRAINKIT_KEY(early_stopping, patience, "integer >= 0", "Epochs without improvement before stopping",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(early_stopping, min_delta, "number >= 0", "Least change that counts as an improvement",
                   as_float(n, w, 0.0, kInf)),
      TRAINKIT_KEY(early_stopping, check_finite, "boolean", "Stop at once when the metric is NaN or infinite",
                   as_bool(n, w)),
      TRAINKIT_KEY(ema, enabled, "boolean",
                   "Keep an EMA of the weights (timm ModelEmaV3), evaluated as val_ema/* and on the test set",
                   as_bool(n, w)),
      TRAINKIT_KEY(ema, decay, "number in [0, 1]", "EMA decay (the warmup's upper bound)",
                   as_float(n, w, 0.0, 1.0)),
      TRAINKIT_KEY(ema, min_decay, "number in [0, 1]", "Lower bound of the warmup's decay", as_float(n, w, 0.0, 1.0)),
      TRAINKIT_KEY(ema, update_after_step, "integer >= 0", "Steps during which the EMA is a copy of the weights",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(ema, use_warmup, "boolean",
                   "Warm the decay up: 1 - (1 + t / warmup_gamma)^-warmup_power, clamped to [min_decay, decay]",
                   as_bool(n, w)),
      TRAINKIT_KEY(ema, warmup_gamma, "number > 0", "See ema.use_warmup", as_float(n, w, 0.0, kInf, true)),
      TRAINKIT_KEY(ema, warmup_power, "number > 0", "See ema.use_warmup", as_float(n, w, 0.0, kInf, true)),
      TRAINKIT_KEY(ema, exclude_buffers, "boolean", "Copy buffers (BatchNorm statistics) instead of averaging them",
                   as_bool(n, w)),
      TRAINKIT_KEY(swa, enabled, "boolean",
                   "Stochastic weight averaging (torch.optim.swa_utils); the averaged weights, after update_bn over "
                   "the training set, are evaluated on the test set at the end",
                   as_bool(n, w)),
      TRAINKIT_KEY(swa, swa_start, "integer >= 0", "First epoch (0-based) averaged in", as_int(n, w, 0)),
      TRAINKIT_KEY(swa, swa_lr, "number >= 0",
                   "SWALR's target LR, which then overrides the scheduler (0 = keep the scheduler's LR)",
                   as_float(n, w, 0.0, kInf)),
      TRAINKIT_KEY(swa, anneal_epochs, "integer >= 0", "SWALR's annealing epochs", as_int(n, w, 0)),
      TRAINKIT_KEY(swa, anneal_strategy, "\"cos\" or \"linear\"", "SWALR's annealing shape",
                   as_choice(n, w, {"cos", "linear"})),
      TRAINKIT_KEY(log, every_steps, "integer >= 1", "Steps between metric rows and console lines",
                   as_int(n, w, 1)),
      TRAINKIT_KEY(log, progress, "\"auto\" or \"bar\" or \"lines\"",
                   "Console: a progress bar (auto: when stderr is a terminal) or plain lines",
                   as_choice(n, w, {"auto", "bar", "lines"})),
      TRAINKIT_KEY(log, tensorboard, "boolean", "Also write TensorBoard event files into the run directory",
                   as_bool(n, w)),
      TRAINKIT_KEY(log, layer_norms, "boolean",
                   "Every log.every_steps steps, each parameter's gradient and weight 2-norm to <run>/layer_norms.csv "
                   "(and TensorBoard norms/grad/<name>, norms/param/<name>)",
                   as_bool(n, w)),
      TRAINKIT_KEY(profile, sync, "boolean",
                   "Synchronize the device after each timed phase of a step so that CUDA work is charged to the phase "
                   "that launched it (slower; the CPU is unaffected)",
                   as_bool(n, w)),
      TRAINKIT_KEY(profile, trace_steps, "integer >= 0",
                   "Record this many steps with LibTorch's profiler into <run>/trace.json, a Chrome trace (0 = off)",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(profile, trace_wait, "integer >= 0", "Steps of the run to let pass before the trace starts",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(profile, record_shapes, "boolean", "Record operator input shapes in the trace", as_bool(n, w)),
      TRAINKIT_KEY(distributed, backend, "\"auto\" or \"gloo\" or \"nccl\"",
                   "Under `trainkit launch`/torchrun: c10d backend (auto: Gloo, NCCL for CUDA)",
                   as_choice(n, w, {"auto", "gloo", "nccl"})),
      TRAINKIT_KEY(distributed, timeout, "number > 0",
                   "Seconds a collective (or the rendezvous) waits for the other ranks before failing",
                   as_float(n, w, 0.0, kInf, true)),
      TRAINKIT_KEY(distributed, bucket_cap_mb, "number > 0",
                   "DDP gradient bucket size in MiB (train.batch_size is per rank)", as_float(n, w, 0.0, kInf, true)),
  };
  return table;
}
#undef TRAINKIT_KEY

const Key* find_key(const std::string& section, const std::string& name) {
  for (const auto& k : keys()) {
    if (k.section == section && k.name == name) {
      return &k;
    }
  }
  return nullptr;
}

/// The tables of a config file, in the order the effective config prints them.
const std::vector<std::string>& sections() {
  static const std::vector<std::string> names = {"data", "model", "optimizer", "train", "grad", "amp",
                                                 "checkpoint", "early_stopping", "ema", "swa", "log",
                                                 "profile", "distributed", "scheduler"};
  return names;
}

std::vector<std::string> known_names(const std::string& section) {
  std::vector<std::string> out;
  for (const auto& k : keys()) {
    if (k.section == section) {
      out.push_back(k.name);
    }
  }
  return out;
}

/// The table `section` of `root`, created when absent; `where` names the override in errors.
ArgTable& section_table(ArgTable& root, const std::string& section, const Where& where) {
  if (find_arg(root, section) == nullptr) {
    set_arg(root, section, ArgTable{});
  }
  ArgTable* table = find_arg(root, section)->get_if<ArgTable>();
  if (table == nullptr) {
    throw ConfigError(fmt::format("{}: '{}' must be a table [{}]", where, section, section));
  }
  return *table;
}

/// `table` in the order TOML readers give it back (`type` first, then by key, nested tables too), so that
/// the effective config prints the same whichever way it was written or overridden.
ArgTable canonical(ArgTable table) {
  std::stable_sort(table.begin(), table.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.first != "type", a.first) < std::make_pair(b.first != "type", b.first);
  });
  for (auto& [key, value] : table) {
    if (const auto* nested = value.get_if<ArgTable>()) {
      value = ArgValue(canonical(*nested), value.line());
    } else if (const auto* items = value.get_if<ArgValue::Array>()) {
      ArgValue::Array sorted;
      for (const auto& item : *items) {
        const auto* t = item.get_if<ArgTable>();
        sorted.push_back(t != nullptr ? ArgValue(canonical(*t), item.line()) : item);
      }
      value = ArgValue(std::move(sorted), value.line());
    }
  }
  return table;
}

/// Applies one `--set section.key=value` to the document; remembers where the value came from.
void apply_override(ArgTable& root, const std::string& text, std::map<std::string, Where>& origin) {
  const Where where = fmt::format("--set {}", text);
  const auto eq = text.find('=');
  if (eq == std::string::npos) {
    throw ConfigError(fmt::format("{}: expected section.key=value", where));
  }
  const std::string path = text.substr(0, eq);
  const auto dot = path.find('.');
  if (dot == std::string::npos) {
    throw ConfigError(fmt::format("{}: key '{}' must be section.key", where, path));
  }
  const std::string section = path.substr(0, dot);
  const std::string name = path.substr(dot + 1);
  const bool open_table = section == "optimizer" || section == "scheduler";  // their readers know their keys
  if (!open_table && find_key(section, name) == nullptr) {
    throw ConfigError(fmt::format("{}: unknown key '{}'", where, path));
  }
  set_arg(section_table(root, section, where), name, parse_toml_value(text.substr(eq + 1)));
  origin[path] = where;
}

/// Reads the plain sections (everything but [optimizer] and [scheduler]) into `config`.
void read_plain_sections(Config& config, const ArgTable& root, const std::string& source,
                         const std::map<std::string, Where>& origin) {
  for (const auto& [section, value] : root) {
    if (std::find(sections().begin(), sections().end(), section) == sections().end()) {
      throw ConfigError(fmt::format("{}: unknown table or key '{}' (line {}); known tables: [{}]", source, section,
                                    value.line(), fmt::join(sections(), "], [")));
    }
    const auto* table = value.get_if<ArgTable>();
    if (table == nullptr) {
      throw ConfigError(fmt::format("{}: '{}' must be a table [{}]", source, section, section));
    }
    if (section == "optimizer" || section == "scheduler") {
      continue;
    }
    for (const auto& [name, node] : *table) {
      const Key* key = find_key(section, name);
      if (key == nullptr) {
        throw ConfigError(fmt::format("{}: unknown key '{}.{}' (line {}); known keys in [{}]: {}", source, section,
                                      name, node.line(), section, fmt::join(known_names(section), ", ")));
      }
      const auto it = origin.find(section + "." + name);
      key->read(config, node, it != origin.end() ? it->second : fmt::format("{}: {}.{}", source, section, name));
    }
  }
}

}  // namespace

Config::Config() {
  const nn::CnnOptions cnn;
  model.channels = cnn.channels();
  model.hidden = cnn.hidden();
  model.dropout = cnn.dropout();
  model.batch_norm = cnn.batch_norm();
  const amp::GradScalerOptions scaler;
  amp.init_scale = scaler.init_scale();
  amp.growth_interval = scaler.growth_interval();
  const dist::InitOptions group;
  distributed.backend = group.backend();
  distributed.timeout = static_cast<double>(group.timeout().count()) / 1000.0;
  distributed.bucket_cap_mb = dist::DistributedDataParallelOptions().bucket_cap_mb();
  const train::ModelCheckpointOptions best;
  checkpoint.monitor = best.monitor();
  checkpoint.mode = best.mode();
  checkpoint.save_last = best.save_last();
  const train::EarlyStoppingOptions stopping;
  early_stopping.monitor = stopping.monitor();
  early_stopping.mode = stopping.mode();
  early_stopping.patience = stopping.patience();
  early_stopping.min_delta = stopping.min_delta();
  early_stopping.check_finite = stopping.check_finite();
  const train::ModelEmaOptions ema_options;
  ema.decay = ema_options.decay();
  ema.min_decay = ema_options.min_decay();
  ema.update_after_step = ema_options.update_after_step();
  ema.use_warmup = ema_options.use_warmup();
  ema.warmup_gamma = ema_options.warmup_gamma();
  ema.warmup_power = ema_options.warmup_power();
  ema.exclude_buffers = ema_options.exclude_buffers();
  const train::ProfilerTraceOptions trace_options("trace.json");
  profile.trace_wait = trace_options.wait();
  profile.record_shapes = trace_options.record_shapes();
  profile.sync = train::TrainerOptions().profile_sync();
  const train::StochasticWeightAveragingOptions swa_options;
  swa.swa_start = swa_options.swa_start();
  swa.swa_lr = swa_options.swa_lr();
  swa.anneal_epochs = swa_options.anneal_epochs();
  swa.anneal_strategy = swa_options.anneal_strategy();
  ArgTable none;
  ArgReader defaults(none, "defaults");
  optimizer = optim::parse_optimizer("adam", defaults);
}

Config parse_config(const std::string& toml_text, const std::string& source,
                    const std::vector<std::string>& overrides) {
  try {
    ArgTable root = parse_toml(toml_text, source);
    std::map<std::string, Where> origin;
    for (const auto& o : overrides) {
      apply_override(root, o, origin);
    }
    Config config;
    read_plain_sections(config, root, source, origin);
    // An error about a key that a --set gave names that --set, not the file (the table merged both).
    const auto named = [&origin](const std::string& section, const std::string& where, const auto& parse) {
      try {
        parse();
      } catch (const ArgError& e) {
        const auto it = origin.find(section + "." + e.key());
        const std::string what = e.what();
        if (e.key().empty() || it == origin.end() || what.rfind(where + ": ", 0) != 0) {
          throw;
        }
        throw ConfigError(it->second + ": " + what.substr(where.size() + 2), e.key());
      }
    };
    named("optimizer", source, [&] {
      const ArgTable empty;
      const ArgValue* opt = find_arg(root, "optimizer");
      ArgReader optimizer(opt != nullptr ? *opt->get_if<ArgTable>() : empty, source);
      const std::string name = optimizer.string("name").value_or("adam");
      config.optimizer = optim::parse_optimizer(name, optimizer);
    });
    if (const ArgValue* sched = find_arg(root, "scheduler")) {
      config.scheduler_args = canonical(*sched->get_if<ArgTable>());
      if (!config.scheduler_args.empty()) {
        const std::string where = source + ": [scheduler]";
        named("scheduler", where,
              [&] { config.scheduler = sched::parse_scheduler(config.scheduler_args, where); });
      }
    }
    return config;
  } catch (const ConfigError&) {
    throw;
  } catch (const ArgError& e) {
    throw ConfigError(e.what(), e.key());
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) {
    throw ConfigError(fmt::format("{}: cannot read config file", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides);
}

std::string to_toml(const Config& config) {
  std::string out;
  for (const auto& section : sections()) {
    std::string body;
    if (section == "optimizer") {
      ArgTable table{{"name", ArgValue(config.optimizer.name)}};
      for (auto& kv : optim::optimizer_args(config.optimizer)) {
        set_arg(table, kv.first, kv.second);
      }
      body = to_toml_lines(table);
    } else if (section == "scheduler") {
      body = to_toml_lines(config.scheduler_args);
    } else {
      for (const auto& k : keys()) {
        if (k.section == section) {
          body += fmt::format("{} = {}\n", k.name, k.show(config));
        }
      }
    }
    if (!body.empty()) {
      out += fmt::format("{}[{}]\n{}", out.empty() ? "" : "\n", section, body);
    }
  }
  return out;
}

std::string config_keys_markdown() {
  const Config defaults;
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  const auto row = [&out](const std::string& key, const std::string& type, const std::string& def,
                          const std::string& doc) { out += fmt::format("| `{}` | {} | {} | {} |\n", key, type, def, doc); };
  for (const auto& section : sections()) {
    if (section == "optimizer") {
      row("optimizer.name", fmt::format("\"{}\"", fmt::join(optim::optimizer_names(), "\", \"")),
          fmt::format("`\"{}\"`", defaults.optimizer.name), "Optimizer (trainkit's own, fused CPU kernels; docs/optimizers.md)");
      for (const auto& arg : optim::optimizer_arg_docs()) {
        row("optimizer." + arg.name, arg.type,
            arg.default_value ? fmt::format("`{}`", arg.default_value->to_string()) : "the optimizer's",
            arg.optimizers.size() == optim::optimizer_names().size()
                ? arg.doc
                : fmt::format("{} (only {})", arg.doc, fmt::join(arg.optimizers, ", ")));
      }
    } else if (section == "scheduler") {
      row("scheduler.*", "table", "none (constant LR)",
          "An LR scheduler: `type` (PyTorch's class name), its arguments by PyTorch's names, and `interval` = "
          "\"step\" or \"epoch\"; see docs/schedulers.md");
    } else {
      for (const auto& k : keys()) {
        if (k.section == section) {
          row(k.section + "." + k.name, k.type, fmt::format("`{}`", k.show(defaults)), k.doc);
        }
      }
    }
  }
  return out;
}

}  // namespace trainkit::app
