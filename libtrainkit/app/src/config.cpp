#include "trainkit/app/config.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <c10/core/DeviceType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trainkit/app/toml_args.h"
#include "trainkit/io/export.h"
#include "trainkit/log/mlflow.h"
#include "trainkit/nn/init.h"
#include "trainkit/train/metric.h"

namespace trainkit::app {
namespace {

/// Where a value came from, for error messages: "FILE: section.key" or "--set section.key=...".
using Where = std::string;

[[noreturn]] void fail(const Where& where, const std::string& expected, const ArgValue& value) {
  const std::string line = value.line() > 0 ? fmt::format(" (line {})", value.line()) : "";
  throw ConfigError(fmt::format("{}: expected {}, got {}{}", where, expected, value.to_string(), line));
}

// Upper bounds of sizes, far above any run that fits in memory, so that a typo (an extra zero or three)
// is refused naming its key instead of ending in bad_alloc or in thread exhaustion.
constexpr int64_t kMaxWorkers = 1024;            ///< threads: train.threads
constexpr int64_t kMaxWidth = int64_t{1} << 20;  ///< model.checkpoint_segments
constexpr int64_t kMaxBatch = int64_t{1} << 24;  ///< batch sizes

/// "auto", "cpu", "cuda" or "cuda:<index>" (index a non-negative integer); also "<name>" or "<name>:<index>"
/// for the out-of-tree backend registered as PrivateUse1 under `name` in this process (c10's
/// register_privateuse1_backend), checked when the value is read.
ValueRule<std::string> device_name() {
  return rule::text_where("\"auto\", \"cpu\", \"cuda\" or \"cuda:<index>\"",
                          "\"auto\", \"cpu\", \"cuda\" or \"cuda:<index>\"", [](const std::string& v) {
                            const auto is_index = [](const std::string& digits) {
                              return !digits.empty() && digits.size() < 6 &&
                                     std::all_of(digits.begin(), digits.end(), ::isdigit);
                            };
                            const auto named = [&](const std::string& name) {
                              return v == name || (v.rfind(name + ":", 0) == 0 && is_index(v.substr(name.size() + 1)));
                            };
                            return v == "auto" || v == "cpu" || named("cuda") ||
                                   (c10::is_privateuse1_backend_registered() && named(c10::get_privateuse1_backend()));
                          });
}

/// What a metric-driven scheduler watches.
ValueRule<std::string> scheduler_monitor() {
  return rule::text_where("string", "\"train/loss\" or \"val/loss\" or \"val/<metric>\"", [](const std::string& v) {
    return v == "train/loss" || v.rfind("val/", 0) == 0;
  });
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

/// Writes one row of the key table: key, type, default, meaning.
using Row = std::function<void(const std::string&, const std::string&, const std::string&, const std::string&)>;

/// One table of a config file. A plain section binds its keys, each to a member of Config (an app setting,
/// or a field of a core Options struct through that struct's binding). A registry's section ([optimizer],
/// [scheduler]) has keys that depend on the optimizer or scheduler it names: its registry reads the table,
/// prints it back and lists its keys.
struct Section {
  Section(std::string name, OptionBinding<Config> keys = {}) : name(std::move(name)), keys(std::move(keys)) {}
  std::string name;
  OptionBinding<Config> keys;
  /// A registry's section: reads the table (empty when the file has none); errors start with `where`.
  std::function<void(const ArgTable& table, const std::string& where, Config& config)> read;
  /// A registry's section: the table as to_toml prints it.
  std::function<ArgTable(const Config& config)> print;
  /// A registry's section: its rows of the key table.
  std::function<void(const Config& defaults, const Row& row)> list;
  /// A registry's section: what its errors start with after the source ("" or ": [scheduler]").
  std::string where;
};

/// [optimizer]: `name` and the named optimizer's arguments (optim::parse_optimizer).
Section optimizer_section() {
  Section s("optimizer");
  s.read = [](const ArgTable& table, const std::string& where, Config& config) {
    ArgReader args(table, where);
    const std::string name = args.string("name").value_or("adam");
    config.optimizer = optim::parse_optimizer(name, args);
  };
  s.print = [](const Config& config) {
    ArgTable table = {{"name", ArgValue(config.optimizer.name)}};
    for (auto& kv : optim::optimizer_args(config.optimizer)) {
      set_arg(table, kv.first, kv.second);
    }
    return table;
  };
  s.list = [](const Config& defaults, const Row& row) {
    row("optimizer.name", fmt::format("\"{}\"", fmt::join(optim::optimizer_names(), "\", \"")),
        fmt::format("`\"{}\"`", defaults.optimizer.name), "Optimizer (trainkit's own, fused CPU kernels; docs/optimizers.md)");
    for (const auto& arg : optim::optimizer_arg_docs()) {
      row("optimizer." + arg.name, arg.type,
          arg.default_value ? fmt::format("`{}`", arg.default_value->to_string()) : "the optimizer's",
          arg.optimizers.size() == optim::optimizer_names().size()
              ? arg.doc
              : fmt::format("{} (only {})", arg.doc, fmt::join(arg.optimizers, ", ")));
    }
  };
  return s;
}

/// [scheduler]: `type`, `interval` and the named scheduler's arguments (sched::parse_scheduler).
Section scheduler_section() {
  Section s("scheduler");
  s.where = ": [scheduler]";
  s.read = [](const ArgTable& table, const std::string& where, Config& config) {
    config.scheduler_args = canonical(table);
    if (!config.scheduler_args.empty()) {
      config.scheduler = sched::parse_scheduler(config.scheduler_args, where);
    }
  };
  s.print = [](const Config& config) { return config.scheduler_args; };
  s.list = [](const Config&, const Row& row) {
    std::vector<std::string> types;
    for (const auto& type : sched::scheduler_types()) {
      if (!sched::scheduler_arg_docs(type).empty()) {
        types.push_back(type);
      }
    }
    row("scheduler.type", fmt::format("\"{}\"", fmt::join(types, "\", \"")), "none (constant LR)",
        "An LR scheduler by PyTorch's class name, with its arguments by PyTorch's names below; see "
        "docs/schedulers.md");
    row("scheduler.interval", "\"step\" or \"epoch\"", "the type's",
        "When it steps: after every optimizer step (CyclicLR, OneCycleLR, WarmupCosine, WarmupStableDecay, "
        "InverseSqrt) or every epoch (the others)");
    for (const auto& type : types) {
      for (const auto& arg : sched::scheduler_arg_docs(type)) {
        row("scheduler." + arg.key, arg.type, arg.default_value, fmt::format("{}: {}", type, arg.doc));
      }
    }
  };
  return s;
}

// `"member", [](auto& c) -> auto& { return c.section.member; }`: an app setting of Config and its key.
#define TRAINKIT_KEY(section, member) #member, [](auto& c) -> auto& { return c.section.member; }

/// Every built-in section, in the order the effective config prints them ([scheduler] last: a program's own
/// sections go before it).
const std::vector<Section>& all_sections() {
  static const std::vector<Section> all = [] {
    const auto trainer = [](auto& c) -> auto& { return c.trainer; };
    const auto& trainer_keys = train::TrainerOptions::binding();
    std::vector<Section> s;
    s.push_back({"data", OptionBinding<Config>()
        .bind(TRAINKIT_KEY(data, dataset), rule::text(),
              "Data set, by the name a data provider loads it under; the built-in image sets read MNIST-style "
              "(gzip'd) IDX files (1x28x28) or CIFAR-10's binary batches data_batch_1..5.bin and test_batch.bin "
              "(3x32x32) from data.dir")
        .bind(TRAINKIT_KEY(data, dir), rule::text(), "Directory with the data set's files (see data.dataset)")
        .bind(TRAINKIT_KEY(data, val_size), rule::integer(0),
              "Training examples held out (from the end of the training file) for validation")
        .bind(TRAINKIT_KEY(data, limit_train), rule::integer(0), "Use only the first N training examples (0 = all)")
        .bind(TRAINKIT_KEY(data, limit_test), rule::integer(0), "Use only the first N test examples (0 = all)")});
    s.push_back({"model", OptionBinding<Config>()
        .bind(TRAINKIT_KEY(model, name), rule::text(),
              "Network, by the name a model provider builds it under; built in: conv blocks + MLP head, a plain "
              "MLP, He et al.'s CIFAR ResNet of model.depth layers, ResNet-18 with a small-image stem, or the "
              "TorchScript model in model.torchscript")
        .bind(TRAINKIT_KEY(model, checkpoint_segments), rule::integer(0, kMaxWidth),
              "Activation checkpointing: train with nn::checkpoint_sequential in this many segments, recomputing "
              "all but the last in backward (0 = off; at most the number of modules)")
        .bind(TRAINKIT_KEY(model, torchscript), rule::text(),
              "torchscript: a torch.jit.save file (a model scripted or traced in Python); its forward takes the "
              "batch's inputs in order, and the trained model is written to <run>/model.torchscript.pt")
        .bind(TRAINKIT_KEY(model, init), rule::one_of(nn::init::scheme_names()),
              "Weight initialization (nn::init::scheme): default is LibTorch's; the others set Linear/Conv weights "
              "by their formula, biases 0, BatchNorm weight 1")});
    s.push_back(optimizer_section());
    s.push_back({"train", OptionBinding<Config>()
        .include(trainer_keys, trainer, {"epochs"})
        .bind(TRAINKIT_KEY(train, batch_size), rule::integer(1, kMaxBatch), "Training batch size (per rank when distributed)")
        .bind(TRAINKIT_KEY(train, eval_batch_size), rule::integer(1, kMaxBatch), "Batch size for validation and test")
        .bind(TRAINKIT_KEY(train, seed), rule::integer(0), "Seed of initialization, dropout and data order")
        .include(trainer_keys, trainer, {"max_steps", "val_every_steps", "val_fraction"})
        .bind(TRAINKIT_KEY(train, threads), rule::integer(0, kMaxWorkers), "Intra-op threads (0 = LibTorch's default)")
        .bind(TRAINKIT_KEY(train, host_cache), rule::boolean(),
              "Cache freed CPU tensor memory of 1 MiB blocks and up for reuse (train::enable_host_caching_allocator): "
              "spares the page faults of allocating each step's activations anew; false: the C library's allocator")
        .bind(TRAINKIT_KEY(train, device), device_name(),
              "Device to train on. cuda: one GPU per rank, cuda:<LOCAL_RANK> under a launcher (cuda:0 alone); "
              "cuda:<index>: that GPU (single-process runs only); auto: as cuda when a GPU is present, else the CPU")
        .bind(TRAINKIT_KEY(train, metrics), train::metric_names_rule(),
              "Metrics evaluated besides the loss: \"accuracy\", \"top<k>_accuracy\", \"mae\", \"mse\"")
        .bind(TRAINKIT_KEY(train, monitor), scheduler_monitor(),
              "What a metric-driven scheduler (reduce_on_plateau) watches: \"val/loss\", \"val/<metric>\" or "
              "\"train/loss\"")
        .bind(TRAINKIT_KEY(train, label_smoothing), rule::number(unit_interval()),
              "Label smoothing of the training loss, as torch.nn.CrossEntropyLoss(label_smoothing=...): targets "
              "(1 - s) * one-hot + s / classes; validation and test losses stay plain cross-entropy (models with "
              "the default loss)")});
    s.push_back({"grad", OptionBinding<Config>().include(
        trainer_keys, trainer, {"accumulation_steps", "clip_grad_norm", "norm_type", "clip_grad_value"},
        {{"clip_grad_norm", "clip_norm"}, {"clip_grad_value", "clip_value"}})});
    s.push_back({"amp", OptionBinding<Config>()
        .bind(TRAINKIT_KEY(amp, enabled), rule::boolean(), "Run forward passes under autocast (mixed precision)")
        .bind(TRAINKIT_KEY(amp, dtype), rule::one_of({"bfloat16", "float16"}),
              "Autocast dtype (CPU: bfloat16, float16; CUDA: both)")
        .bind(TRAINKIT_KEY(amp, grad_scaler), rule::boolean(), "Scale the loss with a GradScaler (for float16)")
        .include(amp::GradScalerOptions::binding(), [](auto& c) -> auto& { return c.amp.scaler; })});
    s.push_back({"checkpoint", OptionBinding<Config>()
        .bind(TRAINKIT_KEY(checkpoint, every_steps), rule::integer(0),
              "Also checkpoint every N steps (0 = only at epoch ends and at the end)")
        .bind(TRAINKIT_KEY(checkpoint, keep_last), rule::integer(1), "Checkpoints kept; older ones are deleted")
        .include(train::ModelCheckpointOptions::binding(), [](auto& c) -> auto& { return c.checkpoint.best; })
        .bind("export", [](auto& c) -> auto& { return c.checkpoint.export_formats; },
              rule::distinct_of(io::export_formats()),
              "Interchange copies of the final weights (<run>/model.*), of the EMA and SWA weights (ema.*, swa.*) "
              "and of every best/ file that Python reads: safetensors (.safetensors), torch.save state_dicts "
              "(.pth, torch.load with weights_only=True) and, for model.name = \"torchscript\", whole TorchScript "
              "models (.torchscript.pt, torch.jit.load)")});
    s.push_back({"early_stopping", OptionBinding<Config>()
        .bind(TRAINKIT_KEY(early_stopping, enabled), rule::boolean(), "Stop when early_stopping.monitor stops improving")
        .include(train::EarlyStoppingOptions::binding(), [](auto& c) -> auto& { return c.early_stopping.options; })});
    s.push_back({"ema", OptionBinding<Config>()
        .bind(TRAINKIT_KEY(ema, enabled), rule::boolean(),
              "Keep an EMA of the weights (timm ModelEmaV3), evaluated as val_ema/* and on the test set")
        .include(train::ModelEmaOptions::binding(), [](auto& c) -> auto& { return c.ema.options; })});
    s.push_back({"swa", OptionBinding<Config>()
        .bind(TRAINKIT_KEY(swa, enabled), rule::boolean(),
              "Stochastic weight averaging (torch.optim.swa_utils); the averaged weights, after update_bn over the "
              "training set, are evaluated on the test set at the end")
        .include(train::StochasticWeightAveragingOptions::binding(), [](auto& c) -> auto& { return c.swa.options; })});
    s.push_back({"log", OptionBinding<Config>()
        .bind(TRAINKIT_KEY(log, every_steps), rule::integer(1), "Steps between metric rows and console lines")
        .bind(TRAINKIT_KEY(log, progress), rule::one_of({"auto", "bar", "lines"}),
              "Console: a progress bar (auto: when stderr is a terminal) or plain lines")
        .bind(TRAINKIT_KEY(log, tensorboard), rule::boolean(), "Also write TensorBoard event files into the run directory")
        .bind(TRAINKIT_KEY(log, layer_norms), rule::boolean(),
              "Every log.every_steps steps, each parameter's gradient and weight 2-norm to <run>/layer_norms.csv (and "
              "TensorBoard norms/grad/<name>, norms/param/<name>)")
        .bind(TRAINKIT_KEY(log, mlflow_uri),
              rule::text_where("string", "\"\" (off) or \"http://host:port\"",
                               [](const std::string& v) {
                                 return v.empty() || v.rfind("http://", 0) == 0 || v.rfind("https://", 0) == 0;
                               }),
              "An MLflow tracking server to log the run to: params, metrics, tags, artifacts (\"\" = off)")
        .bind(TRAINKIT_KEY(log, mlflow_experiment), rule::text(), "The MLflow experiment (created when missing)")
        .bind(TRAINKIT_KEY(log, mlflow_run_name), rule::text(), "The MLflow run's name (\"\" = the run directory's name)")
        .bind(TRAINKIT_KEY(log, time_to_accuracy),
              rule::number_array(NumberRule{"number in (0, 1]", 0.0, true, 1.0, false}),
              "Validation accuracies to time: summary.json's time_to_accuracy gives the wall time since the start "
              "(data loading included) at which validation first reached each (needs \"accuracy\" in train.metrics)")});
    s.push_back({"profile", OptionBinding<Config>()
        .include(trainer_keys, trainer, {"profile_sync"}, {{"profile_sync", "sync"}})
        .bind(TRAINKIT_KEY(profile, trace_steps), rule::integer(0),
              "Record this many steps with LibTorch's profiler into <run>/trace.json, a Chrome trace (0 = off)")
        .include(train::ProfilerTraceOptions::binding(), [](auto& c) -> auto& { return c.profile.trace; }, {},
                 {{"wait", "trace_wait"}})});
    s.push_back({"distributed", OptionBinding<Config>()
        .include(dist::InitOptions::binding(), [](auto& c) -> auto& { return c.distributed.group; })
        .include(dist::DistributedDataParallelOptions::binding(), [](auto& c) -> auto& { return c.distributed.ddp; })});
    s.push_back({"zero", OptionBinding<Config>()
        .include(dist::ZeroOptions::binding(), [](auto& c) -> auto& { return c.distributed.zero; })
        .bind(TRAINKIT_KEY(distributed, offload_optimizer), rule::boolean(),
              "Optimizer state and step on the host (ZeRO-Offload): gradients go down and parameters up once per "
              "step; with any stage, also without ZeRO or a launcher")});
    s.push_back(scheduler_section());
    return s;
  }();
  return all;
}
#undef TRAINKIT_KEY

const Section* find_section(const std::string& name) {
  for (const auto& section : all_sections()) {
    if (section.name == name) {
      return &section;
    }
  }
  return nullptr;
}

const OptionField<Config>* find_key(const std::string& section, const std::string& name) {
  const Section* s = find_section(section);
  return s == nullptr ? nullptr : s->keys.find(name);
}

/// A program's key `section.name` (ConfigExtensions::keys), or null.
const OptionField<ArgTable>* find_extra_key(const ConfigExtensions& extensions, const std::string& section,
                                            const std::string& name) {
  for (const auto& keys : extensions.keys) {
    if (keys.section == section) {
      if (const auto* field = keys.keys.find(name)) {
        return field;
      }
    }
  }
  return nullptr;
}

/// Every key of `section`, the built-in ones first.
std::vector<std::string> section_keys(const ConfigExtensions& extensions, const std::string& section) {
  std::vector<std::string> out;
  if (const Section* s = find_section(section)) {
    out = s->keys.keys();
  }
  for (const auto& keys : extensions.keys) {
    if (keys.section == section) {
      const auto more = keys.keys.keys();
      out.insert(out.end(), more.begin(), more.end());
    }
  }
  return out;
}

/// The tables of a config file, in the order the effective config prints them: the built-in ones, a
/// program's own sections before the last, [scheduler].
std::vector<std::string> sections(const ConfigExtensions& extensions = {}) {
  std::vector<std::string> names;
  for (const auto& section : all_sections()) {
    names.push_back(section.name);
  }
  for (const auto& keys : extensions.keys) {
    if (std::find(names.begin(), names.end(), keys.section) == names.end()) {
      names.insert(names.end() - 1, keys.section);
    }
  }
  return names;
}

/// The names `section.key` takes when it chooses a provider: data.dataset's data sets, model.name's models;
/// null for any other key.
const std::vector<std::string>* provider_names(const ConfigExtensions& extensions, const std::string& section,
                                               const std::string& key) {
  return section == "data" && key == "dataset" ? &extensions.datasets
         : section == "model" && key == "name" ? &extensions.models
                                               : nullptr;
}

/// Every extension key with its default, by section; throws std::logic_error for a key defined twice.
std::map<std::string, ArgTable> extension_defaults(const ConfigExtensions& extensions) {
  std::map<std::string, ArgTable> out;
  for (const auto& keys : extensions.keys) {
    ArgTable& table = out[keys.section];
    for (const auto& [key, value] : keys.defaults) {
      if (find_arg(table, key) != nullptr || find_key(keys.section, key) != nullptr) {
        throw std::logic_error(fmt::format("config key {}.{} is defined twice", keys.section, key));
      }
      table.emplace_back(key, value);
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

/// Applies one `--set section.key=value` to the document; remembers where the value came from.
void apply_override(ArgTable& root, const std::string& text, const ConfigExtensions& extensions,
                    std::map<std::string, Where>& origin) {
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
  const Section* s = find_section(section);
  const bool open_table = s != nullptr && s->read;  // its registry knows its keys
  if (!open_table && find_key(section, name) == nullptr && find_extra_key(extensions, section, name) == nullptr) {
    throw ConfigError(fmt::format("{}: unknown key '{}'", where, path));
  }
  set_arg(section_table(root, section, where), name, parse_toml_value(text.substr(eq + 1)));
  origin[path] = where;
}

/// Reads the plain sections (every table but a registry's) into `config`.
void read_plain_sections(Config& config, const ArgTable& root, const std::string& source,
                         const ConfigExtensions& extensions, const std::map<std::string, Where>& origin) {
  const std::vector<std::string> known = sections(extensions);
  for (const auto& [section, value] : root) {
    if (std::find(known.begin(), known.end(), section) == known.end()) {
      throw ConfigError(fmt::format("{}: unknown table or key '{}' (line {}); known tables: [{}]", source, section,
                                    value.line(), fmt::join(known, "], [")));
    }
    const auto* table = value.get_if<ArgTable>();
    if (table == nullptr) {
      throw ConfigError(fmt::format("{}: '{}' must be a table [{}]", source, section, section));
    }
    if (const Section* s = find_section(section); s != nullptr && s->read) {
      continue;
    }
    for (const auto& [name, node] : *table) {
      const OptionField<Config>* key = find_key(section, name);
      const OptionField<ArgTable>* extra = key == nullptr ? find_extra_key(extensions, section, name) : nullptr;
      if (key == nullptr && extra == nullptr) {
        throw ConfigError(fmt::format("{}: unknown key '{}.{}' (line {}); known keys in [{}]: {}", source, section,
                                      name, node.line(), section, fmt::join(section_keys(extensions, section), ", ")));
      }
      const auto it = origin.find(section + "." + name);
      const Where where = it != origin.end() ? it->second : fmt::format("{}: {}.{}", source, section, name);
      if (const auto* names = provider_names(extensions, section, name)) {
        const auto choice = rule::one_of(*names);
        if (!choice.parse(node)) {
          fail(where, choice.expected, node);
        }
      }
      bool read = false;
      try {
        read = key != nullptr ? key->read(node, config) : extra->read(node, config.extra[section]);
      } catch (const std::invalid_argument& e) {  // a rule that says why (an unknown metric)
        throw ConfigError(fmt::format("{}: {}", where, e.what()));
      }
      if (!read) {
        fail(where, key != nullptr ? key->expected : extra->expected, node);
      }
    }
  }
}

}  // namespace

Config::Config() {
  ArgTable none;
  ArgReader defaults(none, "defaults");
  optimizer = optim::parse_optimizer("adam", defaults);
}

Config parse_config(const std::string& toml_text, const std::string& source,
                    const std::vector<std::string>& overrides, const ConfigExtensions& extensions) {
  try {
    ArgTable root = parse_toml(toml_text, source);
    std::map<std::string, Where> origin;
    for (const auto& o : overrides) {
      apply_override(root, o, extensions, origin);
    }
    Config config;
    config.extra = extension_defaults(extensions);
    read_plain_sections(config, root, source, extensions, origin);
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
    for (const auto& section : all_sections()) {
      if (section.read) {
        const ArgTable empty;
        const ArgValue* table = find_arg(root, section.name);
        const std::string where = source + section.where;
        named(section.name, where,
              [&] { section.read(table != nullptr ? *table->get_if<ArgTable>() : empty, where, config); });
      }
    }
    return config;
  } catch (const ConfigError&) {
    throw;
  } catch (const ArgError& e) {
    throw ConfigError(e.what(), e.key());
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   const ConfigExtensions& extensions) {
  std::ifstream in(path);
  if (!in) {
    throw ConfigError(fmt::format("{}: cannot read config file", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides, extensions);
}

std::string to_toml(const Config& original) {
  // The effective config is saved (config.toml), sent (MLflow params) and uploaded (an artifact): never with
  // the credentials a tracking URI may hold.
  Config config = original;
  config.log.mlflow_uri = log::mlflow_redacted_uri(original.log.mlflow_uri);
  ConfigExtensions own;  // the program's own sections, from the values held
  for (const auto& [section, table] : config.extra) {
    own.keys.push_back(ConfigKeys{section, "", {}, {}});
  }
  std::string out;
  for (const auto& section : sections(own)) {
    ArgTable table;
    if (const Section* s = find_section(section)) {
      table = s->print ? s->print(config) : options_table(s->keys, config);
    }
    if (const auto extra = config.extra.find(section); extra != config.extra.end()) {
      table.insert(table.end(), extra->second.begin(), extra->second.end());
    }
    const std::string body = to_toml_lines(table);
    if (!body.empty()) {
      out += fmt::format("{}[{}]\n{}", out.empty() ? "" : "\n", section, body);
    }
  }
  return out;
}

std::string config_keys_markdown(const ConfigExtensions& extensions) {
  const Config defaults;
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  const auto row = [&out](const std::string& key, const std::string& type, const std::string& def,
                          const std::string& doc) { out += fmt::format("| `{}` | {} | {} | {} |\n", key, type, def, doc); };
  for (const auto& section : sections(extensions)) {
    const Section* s = find_section(section);
    if (s != nullptr && s->list) {
      s->list(defaults, row);
    } else if (s != nullptr) {
      for (const auto& k : s->keys.fields()) {
        const auto* names = provider_names(extensions, section, k.key);
        row(section + "." + k.key, names != nullptr ? rule::one_of(*names).type : k.type,
            fmt::format("`{}`", k.show(defaults)->to_string()), k.doc);
      }
    }
    for (const auto& keys : extensions.keys) {
      if (keys.section != section) {
        continue;
      }
      for (const auto& k : keys.keys.fields()) {
        const auto value = k.show(keys.defaults);
        row(section + "." + k.key, k.type, value ? fmt::format("`{}`", value->to_string()) : "unset",
            keys.applies.empty() ? k.doc : fmt::format("{} (when {})", k.doc, keys.applies));
      }
    }
  }
  return out;
}

}  // namespace trainkit::app
