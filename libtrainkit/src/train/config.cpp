#include "trainkit/train/config.h"

#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "trainkit/optim.h"
#include "trainkit/sched/factory.h"

namespace trainkit::train {
namespace {

/// Where a value came from, for error messages: "FILE: [section] key" or "--set section.key=...".
using Where = std::string;

[[noreturn]] void fail(const Where& where, const std::string& expected, const toml::node& node) {
  std::ostringstream got;
  node.visit([&got](const auto& value) { got << value; });
  std::string line;
  if (node.source().begin.line > 0) {
    line = fmt::format(" (line {})", node.source().begin.line);
  }
  throw ConfigError(fmt::format("{}: expected {}, got {}{}", where, expected, got.str(), line));
}

constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t as_int(const toml::node& n, const Where& w, int64_t lo, int64_t hi = kNoMax) {
  const std::string expected = hi == kNoMax ? fmt::format("an integer >= {}", lo)
                                            : fmt::format("an integer in [{}, {}]", lo, hi);
  const auto* v = n.as_integer();
  if (v == nullptr || v->get() < lo || v->get() > hi) {
    fail(w, expected, n);
  }
  return v->get();
}

/// A float (integers accepted) in [lo, hi], or (lo, hi] when `lo_open`, or [lo, hi) when `hi_open`.
double as_float(const toml::node& n, const Where& w, double lo, double hi, bool lo_open = false,
                bool hi_open = false) {
  std::string expected = "a number";
  if (std::isfinite(lo) && std::isfinite(hi)) {
    expected = fmt::format("a number in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  } else if (std::isfinite(lo)) {
    expected = fmt::format("a number {} {}", lo_open ? ">" : ">=", lo);
  }
  double x = 0;
  if (const auto* f = n.as_floating_point()) {
    x = f->get();
  } else if (const auto* i = n.as_integer()) {
    x = static_cast<double>(i->get());
  } else {
    fail(w, expected, n);
  }
  const bool ok = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  if (!ok) {
    fail(w, expected, n);
  }
  return x;
}

double as_norm_type(const toml::node& n, const Where& w) {
  if (const auto* f = n.as_floating_point(); f != nullptr && std::isinf(f->get()) && f->get() > 0) {
    return f->get();
  }
  return as_float(n, w, 0.0, kInf, true);
}

bool as_bool(const toml::node& n, const Where& w) {
  const auto* v = n.as_boolean();
  if (v == nullptr) {
    fail(w, "true or false", n);
  }
  return v->get();
}

std::string as_string(const toml::node& n, const Where& w) {
  const auto* v = n.as_string();
  if (v == nullptr) {
    fail(w, "a string", n);
  }
  return v->get();
}

std::string as_choice(const toml::node& n, const Where& w, const std::vector<std::string>& choices) {
  const auto* v = n.as_string();
  const std::string expected = fmt::format("one of \"{}\"", fmt::join(choices, "\", \""));
  if (v == nullptr || std::find(choices.begin(), choices.end(), v->get()) == choices.end()) {
    fail(w, expected, n);
  }
  return v->get();
}

std::vector<int64_t> as_positive_ints(const toml::node& n, const Where& w) {
  const auto* a = n.as_array();
  const std::string expected = "a non-empty array of integers >= 1";
  if (a == nullptr || a->empty()) {
    fail(w, expected, n);
  }
  std::vector<int64_t> out;
  for (const auto& e : *a) {
    const auto* i = e.as_integer();
    if (i == nullptr || i->get() < 1) {
      fail(w, expected, n);
    }
    out.push_back(i->get());
  }
  return out;
}

std::array<double, 2> as_betas(const toml::node& n, const Where& w) {
  const auto* a = n.as_array();
  const std::string expected = "an array of two numbers in [0, 1)";
  if (a == nullptr || a->size() != 2) {
    fail(w, expected, n);
  }
  std::array<double, 2> out{};
  for (size_t i = 0; i < 2; ++i) {
    const auto& e = *a->get(i);
    if (!(e.is_floating_point() || e.is_integer())) {
      fail(w, expected, n);
    }
    const double x = e.is_floating_point() ? e.as_floating_point()->get()
                                           : static_cast<double>(e.as_integer()->get());
    if (!(x >= 0.0 && x < 1.0)) {
      fail(w, expected, n);
    }
    out[i] = x;
  }
  return out;
}

// TOML literals for the effective config; "" means "unset" and the key is left out.
std::string lit(int64_t v) { return std::to_string(v); }
std::string lit(bool v) { return v ? "true" : "false"; }
std::string lit(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) {
    s += ".0";
  }
  return s;
}
std::string lit(const std::string& v) {
  std::ostringstream out;
  out << toml::value<std::string>(v);
  return out.str();
}
std::string lit(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }
std::string lit(const std::array<double, 2>& v) { return fmt::format("[{}, {}]", lit(v[0]), lit(v[1])); }
template <class T>
std::string lit(const std::optional<T>& v) {
  return v ? lit(*v) : std::string();
}

/// One documented key: how to read it into a TrainConfig and how to print it back.
struct Key {
  std::string section;
  std::string name;
  std::string type;
  std::string doc;
  std::function<void(TrainConfig&, const toml::node&, const Where&)> read;
  std::function<std::string(const TrainConfig&)> show;
};

// Each key is written once: section, member, type text, doc and the expression that reads `n` at `w`.
#define TRAINKIT_KEY(section, member, type, doc, expr)                                              \
  Key {                                                                                             \
    #section, #member, type, doc,                                                                   \
        [](TrainConfig& c, const toml::node& n, const Where& w) { c.section.member = (expr); },    \
        [](const TrainConfig& c) { return lit(c.section.member); }                                  \
  }

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      TRAINKIT_KEY(data, dir, "string", "Directory with the (gzip'd) IDX files", as_string(n, w)),
      TRAINKIT_KEY(data, val_size, "integer >= 0",
                   "Training examples held out (from the end of the training file) for validation",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(data, limit_train, "integer >= 0", "Use only the first N training examples (0 = all)",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(data, limit_test, "integer >= 0", "Use only the first N test examples (0 = all)",
                   as_int(n, w, 0)),
      TRAINKIT_KEY(model, name, "\"cnn\" or \"mlp\"", "Network: conv blocks + MLP head, or a plain MLP",
                   as_choice(n, w, {"cnn", "mlp"})),
      TRAINKIT_KEY(model, channels, "array of integers >= 1",
                   "cnn: output channels of each 3x3 conv block (each halves the resolution)",
                   as_positive_ints(n, w)),
      TRAINKIT_KEY(model, hidden, "integer >= 1", "Width of the hidden fully connected layer",
                   as_int(n, w, 1)),
      TRAINKIT_KEY(model, dropout, "number in [0, 1)", "Dropout before each fully connected layer",
                   as_float(n, w, 0.0, 1.0, false, true)),
      TRAINKIT_KEY(model, batch_norm, "boolean", "cnn: batch normalization after each convolution",
                   as_bool(n, w)),
      TRAINKIT_KEY(optimizer, name, "\"adam\", \"adamw\", \"sgd\", \"lars\" or \"lamb\"",
                   "Optimizer (trainkit's own, fused CPU kernels; docs: README, Optimizers)",
                   as_choice(n, w, {"adam", "adamw", "sgd", "lars", "lamb"})),
      TRAINKIT_KEY(optimizer, lr, "number > 0", "Learning rate", as_float(n, w, 0.0, kInf, true)),
      TRAINKIT_KEY(optimizer, betas, "[number, number] in [0, 1)", "adam/adamw/lamb: (beta1, beta2)",
                   as_betas(n, w)),
      TRAINKIT_KEY(optimizer, eps, "number >= 0", "adam/adamw/lamb: term added to the denominator; lars: to "
                   "the trust ratio's denominator", as_float(n, w, 0.0, kInf)),
      TRAINKIT_KEY(optimizer, weight_decay, "number >= 0",
                   "L2 penalty (adam, sgd), decoupled decay (adamw), decay inside the adapted update (lars, lamb)",
                   as_float(n, w, 0.0, kInf)),
      TRAINKIT_KEY(optimizer, amsgrad, "boolean", "adam/adamw: AMSGrad variant", as_bool(n, w)),
      TRAINKIT_KEY(optimizer, momentum, "number >= 0", "sgd/lars: momentum factor", as_float(n, w, 0.0, kInf)),
      TRAINKIT_KEY(optimizer, dampening, "number >= 0", "sgd/lars: dampening for momentum",
                   as_float(n, w, 0.0, kInf)),
      TRAINKIT_KEY(optimizer, nesterov, "boolean",
                   "sgd/lars: Nesterov momentum (needs momentum > 0, dampening 0)", as_bool(n, w)),
      TRAINKIT_KEY(optimizer, trust_coefficient, "number > 0", "lars: trust coefficient (timm's trust_coeff)",
                   as_float(n, w, 0.0, kInf, true)),
      TRAINKIT_KEY(optimizer, trust_clip, "boolean", "lars: LARC clipping of the ratio; lamb: ratio clipped at 1",
                   as_bool(n, w)),
      TRAINKIT_KEY(optimizer, always_adapt, "boolean",
                   "lars/lamb: adapt every parameter, also those with weight_decay 0", as_bool(n, w)),
      TRAINKIT_KEY(optimizer, bias_correction, "boolean", "lamb: Adam's bias correction of the moments",
                   as_bool(n, w)),
      TRAINKIT_KEY(optimizer, grad_averaging, "boolean", "lamb: m = b1 m + (1-b1) g (false: m = b1 m + g)",
                   as_bool(n, w)),
      TRAINKIT_KEY(optimizer, max_grad_norm, "number >= 0", "lamb: global gradient-norm clip (0 = none)",
                   as_float(n, w, 0.0, kInf)),
      TRAINKIT_KEY(optimizer, no_decay_1d, "boolean",
                   "Parameters with ndim <= 1 (biases, norm weights) in a group with weight_decay 0",
                   as_bool(n, w)),
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
      TRAINKIT_KEY(train, device, "\"cpu\" or \"cuda\"", "Device to train on", as_choice(n, w, {"cpu", "cuda"})),
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
      TRAINKIT_KEY(log, every_steps, "integer >= 1", "Steps between metric rows and console lines",
                   as_int(n, w, 1)),
      TRAINKIT_KEY(log, progress, "\"auto\" or \"bar\" or \"lines\"",
                   "Console: a progress bar (auto: when stderr is a terminal) or plain lines",
                   as_choice(n, w, {"auto", "bar", "lines"})),
      TRAINKIT_KEY(log, tensorboard, "boolean", "Also write TensorBoard event files into the run directory",
                   as_bool(n, w)),
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

std::vector<std::string> known_sections() {
  std::vector<std::string> out;
  for (const auto& k : keys()) {
    if (std::find(out.begin(), out.end(), k.section) == out.end()) {
      out.push_back(k.section);
    }
  }
  return out;
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

std::string toml_text(const toml::table& table) {
  std::ostringstream out;
  out << table;
  return out.str();
}

void apply_table(TrainConfig& config, const toml::table& root, const std::string& source) {
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    if (section == "scheduler") {
      const auto* table = section_node.as_table();
      if (table == nullptr) {
        throw ConfigError(fmt::format("{}: 'scheduler' must be a table [scheduler]", source));
      }
      config.scheduler = toml_text(*table);  // validated once the optimizer is known
      continue;
    }
    const auto sections = known_sections();
    if (std::find(sections.begin(), sections.end(), section) == sections.end()) {
      throw ConfigError(fmt::format("{}: unknown table or key '{}' (line {}); known tables: [{}], [scheduler]",
                                    source, section, section_key.source().begin.line, fmt::join(sections, "], [")));
    }
    const auto* table = section_node.as_table();
    if (table == nullptr) {
      throw ConfigError(fmt::format("{}: '{}' must be a table [{}]", source, section, section));
    }
    for (const auto& [name_key, node] : *table) {
      const std::string name(name_key.str());
      const Key* key = find_key(section, name);
      if (key == nullptr) {
        throw ConfigError(fmt::format("{}: unknown key '{}.{}' (line {}); known keys in [{}]: {}", source,
                                      section, name, name_key.source().begin.line, section,
                                      fmt::join(known_names(section), ", ")));
      }
      key->read(config, node, fmt::format("{}: {}.{}", source, section, name));
    }
  }
}

void apply_override(TrainConfig& config, const std::string& override_text) {
  const Where where = fmt::format("--set {}", override_text);
  const auto eq = override_text.find('=');
  if (eq == std::string::npos) {
    throw ConfigError(fmt::format("{}: expected section.key=value", where));
  }
  const std::string path = override_text.substr(0, eq);
  const std::string value = override_text.substr(eq + 1);
  const auto dot = path.find('.');
  if (dot == std::string::npos) {
    throw ConfigError(fmt::format("{}: key '{}' must be section.key", where, path));
  }
  const std::string section = path.substr(0, dot);
  const std::string name = path.substr(dot + 1);
  // The value is TOML (numbers, booleans, arrays, quoted strings); anything else is a bare string.
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};
  }
  if (section == "scheduler") {
    toml::table table = config.scheduler.empty() ? toml::table{} : toml::parse(config.scheduler);
    table.insert_or_assign(name, *parsed.get("v"));
    config.scheduler = toml_text(table);
    return;
  }
  const Key* key = find_key(section, name);
  if (key == nullptr) {
    throw ConfigError(fmt::format("{}: unknown key '{}'", where, path));
  }
  key->read(config, *parsed.get("v"), where);
}

/// Checks that optimizer arguments apply to the chosen optimizer and fills unset ones with its defaults
/// (read from the optimizer's own options type, so each default is written once).
void resolve_optimizer(OptimizerConfig& o, const std::string& source) {
  using List = std::vector<std::string>;
  const std::vector<std::tuple<const char*, bool, List>> optional_keys = {
      {"betas", o.betas.has_value(), {"adam", "adamw", "lamb"}},
      {"eps", o.eps.has_value(), {"adam", "adamw", "lars", "lamb"}},
      {"amsgrad", o.amsgrad.has_value(), {"adam", "adamw"}},
      {"momentum", o.momentum.has_value(), {"sgd", "lars"}},
      {"dampening", o.dampening.has_value(), {"sgd", "lars"}},
      {"nesterov", o.nesterov.has_value(), {"sgd", "lars"}},
      {"trust_coefficient", o.trust_coefficient.has_value(), {"lars"}},
      {"trust_clip", o.trust_clip.has_value(), {"lars", "lamb"}},
      {"always_adapt", o.always_adapt.has_value(), {"lars", "lamb"}},
      {"bias_correction", o.bias_correction.has_value(), {"lamb"}},
      {"grad_averaging", o.grad_averaging.has_value(), {"lamb"}},
      {"max_grad_norm", o.max_grad_norm.has_value(), {"lamb"}}};
  for (const auto& [key, present, applies] : optional_keys) {
    if (present && std::find(applies.begin(), applies.end(), o.name) == applies.end()) {
      throw ConfigError(fmt::format("{}: optimizer.{} does not apply to optimizer \"{}\" (only to {})", source, key,
                                    o.name, fmt::join(applies, ", ")));
    }
  }
  const auto betas_of = [](const auto& d) {
    return std::array<double, 2>{std::get<0>(d.betas()), std::get<1>(d.betas())};
  };
  const auto common = [&o](const auto& d) {
    o.lr = o.lr.value_or(d.lr());
    o.weight_decay = o.weight_decay.value_or(d.weight_decay());
  };
  if (o.name == "adam" || o.name == "adamw") {
    const auto set = [&](const auto& d) {
      common(d);
      o.betas = o.betas.value_or(betas_of(d));
      o.eps = o.eps.value_or(d.eps());
      o.amsgrad = o.amsgrad.value_or(d.amsgrad());
    };
    if (o.name == "adam") {
      set(optim::AdamOptions());
    } else {
      set(optim::AdamWOptions());
    }
  } else if (o.name == "sgd" || o.name == "lars") {
    const auto set = [&](const auto& d) {
      common(d);
      o.momentum = o.momentum.value_or(d.momentum());
      o.dampening = o.dampening.value_or(d.dampening());
      o.nesterov = o.nesterov.value_or(d.nesterov());
    };
    if (o.name == "sgd") {
      set(optim::SgdOptions());
    } else {
      const optim::LarsOptions d;
      set(d);
      o.trust_coefficient = o.trust_coefficient.value_or(d.trust_coefficient());
      o.eps = o.eps.value_or(d.eps());
      o.trust_clip = o.trust_clip.value_or(d.trust_clip());
      o.always_adapt = o.always_adapt.value_or(d.always_adapt());
    }
    if (*o.nesterov && (*o.momentum <= 0 || *o.dampening != 0)) {
      throw ConfigError(fmt::format("{}: optimizer.nesterov = true needs momentum > 0 and dampening = 0 "
                                    "(got momentum {}, dampening {})",
                                    source, *o.momentum, *o.dampening));
    }
  } else {
    const optim::LambOptions d;
    common(d);
    o.betas = o.betas.value_or(betas_of(d));
    o.eps = o.eps.value_or(d.eps());
    o.bias_correction = o.bias_correction.value_or(d.bias_correction());
    o.grad_averaging = o.grad_averaging.value_or(d.grad_averaging());
    o.max_grad_norm = o.max_grad_norm.value_or(d.max_grad_norm().value_or(0.0));
    o.trust_clip = o.trust_clip.value_or(d.trust_clip());
    o.always_adapt = o.always_adapt.value_or(d.always_adapt());
  }
}

/// Builds the scheduler once against a stand-in optimizer of the configured kind, so that a bad
/// [scheduler] table fails before anything is loaded or written.
void validate_scheduler(const TrainConfig& config, const std::string& source) {
  if (config.scheduler.empty()) {
    return;
  }
  const auto opt = make_optimizer(config.optimizer, {torch::zeros({1}, torch::requires_grad())});
  // The data is not loaded yet: estimate the steps per epoch from the MNIST-format training file's
  // 60 000 examples (the job builds the scheduler again with the real count before training).
  const int64_t examples = (config.data.limit_train > 0 ? std::min<int64_t>(config.data.limit_train, 60000) : 60000) -
                           config.data.val_size;
  const int64_t steps_per_epoch = std::max<int64_t>(
      1, (std::max<int64_t>(examples, 1) + config.train.batch_size - 1) / config.train.batch_size /
             std::max<int64_t>(config.grad.accumulation_steps, 1));
  try {
    sched::make_scheduler(config.scheduler, *opt, source + ": [scheduler]",
                          sched::SchedulerContext{config.train.epochs, steps_per_epoch});
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
}

}  // namespace

namespace {

/// One group, or the no-decay split, of `params` with `options`.
template <class Optimizer, class Options>
std::unique_ptr<torch::optim::Optimizer> build(const std::vector<at::Tensor>& params, const Options& options,
                                               bool no_decay_1d) {
  if (no_decay_1d) {
    return std::make_unique<Optimizer>(optim::weight_decay_param_groups(params, options), options);
  }
  return std::make_unique<Optimizer>(params, options);
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& o,
                                                        const std::vector<at::Tensor>& params) {
  const auto adam_like = [&o](auto options) {
    return options.betas({(*o.betas)[0], (*o.betas)[1]}).eps(*o.eps).weight_decay(*o.weight_decay).amsgrad(*o.amsgrad);
  };
  if (o.name == "adam") {
    return build<optim::Adam>(params, adam_like(optim::AdamOptions(*o.lr)), o.no_decay_1d);
  }
  if (o.name == "adamw") {
    return build<optim::AdamW>(params, adam_like(optim::AdamWOptions(*o.lr)), o.no_decay_1d);
  }
  if (o.name == "sgd") {
    return build<optim::Sgd>(params,
                             optim::SgdOptions(*o.lr)
                                 .momentum(*o.momentum)
                                 .dampening(*o.dampening)
                                 .weight_decay(*o.weight_decay)
                                 .nesterov(*o.nesterov),
                             o.no_decay_1d);
  }
  if (o.name == "lars") {
    return build<optim::Lars>(params,
                              optim::LarsOptions(*o.lr)
                                  .momentum(*o.momentum)
                                  .dampening(*o.dampening)
                                  .weight_decay(*o.weight_decay)
                                  .nesterov(*o.nesterov)
                                  .trust_coefficient(*o.trust_coefficient)
                                  .eps(*o.eps)
                                  .trust_clip(*o.trust_clip)
                                  .always_adapt(*o.always_adapt),
                              o.no_decay_1d);
  }
  optim::LambOptions lamb(*o.lr);
  lamb.betas({(*o.betas)[0], (*o.betas)[1]})
      .eps(*o.eps)
      .weight_decay(*o.weight_decay)
      .bias_correction(*o.bias_correction)
      .grad_averaging(*o.grad_averaging)
      .trust_clip(*o.trust_clip)
      .always_adapt(*o.always_adapt);
  lamb.max_grad_norm(*o.max_grad_norm > 0 ? std::optional<double>(*o.max_grad_norm) : std::nullopt);
  return build<optim::Lamb>(params, lamb, o.no_decay_1d);
}

TrainConfig parse_config(const std::string& toml_text, const std::string& source,
                         const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}: TOML syntax error at line {}, column {}: {}", source,
                                  e.source().begin.line, e.source().begin.column, e.description()));
  }
  TrainConfig config;
  apply_table(config, root, source);
  for (const auto& o : overrides) {
    apply_override(config, o);
  }
  resolve_optimizer(config.optimizer, source);
  validate_scheduler(config, source);
  return config;
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) {
    throw ConfigError(fmt::format("{}: cannot read config file", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides);
}

std::string to_toml(const TrainConfig& config) {
  std::string out;
  std::string section;
  for (const auto& k : keys()) {
    const std::string value = k.show(config);
    if (value.empty()) {
      continue;
    }
    if (k.section != section) {
      section = k.section;
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    }
    out += fmt::format("{} = {}\n", k.name, value);
  }
  if (!config.scheduler.empty()) {
    out += "\n[scheduler]\n" + config.scheduler + "\n";
  }
  return out;
}

std::string config_keys_markdown() {
  const TrainConfig defaults;
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& k : keys()) {
    const std::string value = k.show(defaults);
    const std::string def = value.empty() ? "the optimizer's" : fmt::format("`{}`", value);
    out += fmt::format("| `{}.{}` | {} | {} | {} |\n", k.section, k.name, k.type, def, k.doc);
  }
  out += "| `scheduler.*` | table | none (constant LR) | An LR scheduler: `type` (PyTorch's class name), its "
         "arguments by PyTorch's names, and `interval` = \"step\" or \"epoch\"; see docs/schedulers.md |\n";
  return out;
}

}  // namespace trainkit::train
