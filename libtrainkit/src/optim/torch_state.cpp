#include "trainkit/optim/torch_state.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trainkit/io/torch_save.h"
#include "trainkit/optim/adadelta.h"
#include "trainkit/optim/adagrad.h"
#include "trainkit/optim/adam.h"
#include "trainkit/optim/adamax.h"
#include "trainkit/optim/asgd.h"
#include "trainkit/optim/nadam.h"
#include "trainkit/optim/radam.h"
#include "trainkit/optim/rprop.h"
#include "trainkit/optim/sgd.h"

namespace trainkit::optim {
namespace {
// Named, so that nothing here meets the helpers of the other optim sources in a unity build.
namespace python_state {

using c10::IValue;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::invalid_argument(where + ": " + what);
}

// torch.optim's group keys that choose a code path or serve autograd/graphs, not the numbers of a step, and
// the LR schedulers' record of the first learning rate.
const std::set<std::string>& ignored_group_keys() {
  static const std::set<std::string> keys{"foreach", "fused", "differentiable", "capturable", "initial_lr"};
  return keys;
}

// A number of the file: a Python int or float, or a 0-dim tensor (torch.optim's step, ASGD's eta and mu).
std::optional<double> number_of(const IValue& v) {
  if (v.isDouble()) {
    return v.toDouble();
  }
  if (v.isInt()) {
    return static_cast<double>(v.toInt());
  }
  if (v.isTensor() && v.toTensor().dim() == 0 && v.toTensor().is_floating_point()) {
    return v.toTensor().item<double>();
  }
  return std::nullopt;
}

// A hyperparameter as the options binding reads it; nullopt for None (an optional flag left unset).
std::optional<ArgValue> arg_value(const IValue& v, const std::string& where) {
  if (v.isNone()) {
    return std::nullopt;
  }
  if (v.isBool()) {
    return ArgValue(v.toBool());
  }
  if (v.isInt()) {
    return ArgValue(v.toInt());
  }
  if (v.isString()) {
    return ArgValue(v.toStringRef());
  }
  if (const auto x = number_of(v)) {
    return ArgValue(*x);
  }
  if (v.isTuple() || v.isList()) {
    ArgValue::Array items;
    for (const IValue& item : v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec()) {
      auto x = arg_value(item, where);
      if (!x) {
        fail(where, "None inside a tuple");
      }
      items.push_back(std::move(*x));
    }
    return ArgValue(std::move(items));
  }
  fail(where, std::string("a ") + v.tagKind() + ", not a number, boolean, string or tuple");
}

// One key of a parameter's state: how it is read into `State`, and whether the file must have it.
template <class Opt>
struct StateKey {
  using State = typename Opt::param_state_type;
  using Options = typename Opt::options_type;
  std::string name;
  std::function<void(State&, const IValue&, const at::Tensor& param, const std::string& where)> read;
  std::function<bool(const Options&)> required;  // null: always
};

// What torch.optim's state_dict holds for `Opt`: the state keys, and group keys that must have a given value
// (the flag that tells Adam from AdamW).
template <class Opt>
struct StateSpec {
  std::vector<StateKey<Opt>> keys;
  std::vector<std::pair<std::string, bool>> fixed;
};

at::Tensor state_tensor(const IValue& v, const at::Tensor& param, bool like_param, const std::string& where) {
  if (!v.isTensor()) {
    fail(where, std::string("expected a tensor, got a ") + v.tagKind());
  }
  const at::Tensor& t = v.toTensor();
  if (like_param && t.sizes() != param.sizes()) {
    fail(where, fmt::format("shape {} but the parameter's is {}", t.sizes(), param.sizes()));
  }
  if (!like_param && t.dim() != 0) {
    fail(where, fmt::format("expected a 0-dim tensor, got shape {}", t.sizes()));
  }
  const auto dtype = t.scalar_type();
  if (!t.is_floating_point() ||
      (like_param && dtype != param.scalar_type() && dtype != internal::state_dtype(param.scalar_type()))) {
    fail(where, fmt::format("dtype {} but the parameter's is {}", c10::toString(dtype),
                            c10::toString(param.scalar_type())));
  }
  return t.to(param.device());
}

double state_number(const IValue& v, const std::string& where) {
  const auto x = number_of(v);
  if (!x) {
    fail(where, std::string("expected a number or a 0-dim tensor, got a ") + v.tagKind());
  }
  return *x;
}

// torch.optim's step (a 0-dim float tensor, or an int in old files).
template <class Opt>
StateKey<Opt> step_key() {
  return {"step",
          [](auto& s, const IValue& v, const at::Tensor& /*param*/, const std::string& where) {
            const double x = state_number(v, where);
            if (!(x >= 0) || x != std::floor(x)) {
              fail(where, fmt::format("expected a whole number of steps >= 0, got {}", x));
            }
            s.step(static_cast<int64_t>(x));
          },
          nullptr};
}

// A tensor of the parameter's shape (`like_param`) or a 0-dim one, stored through `member`.
template <class Opt, class Member>
StateKey<Opt> tensor_key(std::string name, Member member, bool like_param = true,
                         std::function<bool(const typename Opt::options_type&)> required = nullptr) {
  return {std::move(name),
          [member, like_param](auto& s, const IValue& v, const at::Tensor& param, const std::string& where) {
            member(s) = state_tensor(v, param, like_param, where);
          },
          std::move(required)};
}

// A number kept as a double (ASGD's eta and mu).
template <class Opt, class Member>
StateKey<Opt> number_key(std::string name, Member member) {
  return {std::move(name),
          [member](auto& s, const IValue& v, const at::Tensor& /*param*/, const std::string& where) {
            member(s) = state_number(v, where);
          },
          nullptr};
}

#define TRAINKIT_STATE_MEMBER(field) [](auto& s) -> auto& { return s.field(); }

template <class Opt>
StateSpec<Opt> adam_spec(bool decoupled) {
  using Options = typename Opt::options_type;
  return {{step_key<Opt>(), tensor_key<Opt>("exp_avg", TRAINKIT_STATE_MEMBER(exp_avg)),
           tensor_key<Opt>("exp_avg_sq", TRAINKIT_STATE_MEMBER(exp_avg_sq)),
           tensor_key<Opt>("max_exp_avg_sq", TRAINKIT_STATE_MEMBER(max_exp_avg_sq), true,
                           [](const Options& o) { return o.amsgrad(); })},
          {{"decoupled_weight_decay", decoupled}}};
}

StateSpec<Adam> spec_of(const Adam*) { return adam_spec<Adam>(false); }
StateSpec<AdamW> spec_of(const AdamW*) { return adam_spec<AdamW>(true); }
StateSpec<Sgd> spec_of(const Sgd*) {
  // torch.optim.SGD keeps no state without momentum.
  return {{tensor_key<Sgd>("momentum_buffer", TRAINKIT_STATE_MEMBER(momentum_buffer), true,
                           [](const SgdOptions& o) { return o.momentum() != 0; })},
          {}};
}
StateSpec<RAdam> spec_of(const RAdam*) {
  return {{step_key<RAdam>(), tensor_key<RAdam>("exp_avg", TRAINKIT_STATE_MEMBER(exp_avg)),
           tensor_key<RAdam>("exp_avg_sq", TRAINKIT_STATE_MEMBER(exp_avg_sq))},
          {}};
}
StateSpec<NAdam> spec_of(const NAdam*) {
  return {{step_key<NAdam>(), tensor_key<NAdam>("mu_product", TRAINKIT_STATE_MEMBER(mu_product), false),
           tensor_key<NAdam>("exp_avg", TRAINKIT_STATE_MEMBER(exp_avg)),
           tensor_key<NAdam>("exp_avg_sq", TRAINKIT_STATE_MEMBER(exp_avg_sq))},
          {}};
}
StateSpec<Adamax> spec_of(const Adamax*) {
  return {{step_key<Adamax>(), tensor_key<Adamax>("exp_avg", TRAINKIT_STATE_MEMBER(exp_avg)),
           tensor_key<Adamax>("exp_inf", TRAINKIT_STATE_MEMBER(exp_inf))},
          {}};
}
StateSpec<Adagrad> spec_of(const Adagrad*) {
  return {{step_key<Adagrad>(), tensor_key<Adagrad>("sum", TRAINKIT_STATE_MEMBER(sum))}, {}};
}
StateSpec<Adadelta> spec_of(const Adadelta*) {
  return {{step_key<Adadelta>(), tensor_key<Adadelta>("square_avg", TRAINKIT_STATE_MEMBER(square_avg)),
           tensor_key<Adadelta>("acc_delta", TRAINKIT_STATE_MEMBER(acc_delta))},
          {}};
}
StateSpec<Asgd> spec_of(const Asgd*) {
  return {{step_key<Asgd>(), number_key<Asgd>("eta", TRAINKIT_STATE_MEMBER(eta)),
           number_key<Asgd>("mu", TRAINKIT_STATE_MEMBER(mu)), tensor_key<Asgd>("ax", TRAINKIT_STATE_MEMBER(ax))},
          {}};
}
StateSpec<Rprop> spec_of(const Rprop*) {
  return {{step_key<Rprop>(), tensor_key<Rprop>("prev", TRAINKIT_STATE_MEMBER(prev)),
           tensor_key<Rprop>("step_size", TRAINKIT_STATE_MEMBER(step_size))},
          {}};
}

#undef TRAINKIT_STATE_MEMBER

const IValue& item(const c10::Dict<IValue, IValue>& dict, const char* key, const std::string& where) {
  const auto it = dict.find(IValue(std::string(key)));
  if (it == dict.end()) {
    fail(where, fmt::format("not a torch.optim state_dict: no '{}'", key));
  }
  return it->value();
}

// The group's options: the optimizer's, with the file's keys read through the binding, validated.
template <class Opt>
typename Opt::options_type group_options(const typename Opt::options_type& current,
                                         const c10::Dict<IValue, IValue>& group, const StateSpec<Opt>& spec,
                                         const std::string& where) {
  using Options = typename Opt::options_type;
  const auto& binding = Options::binding().fields();
  Options options = current;
  for (const auto& entry : group) {
    if (!entry.key().isString()) {
      fail(where, std::string("a key is a ") + entry.key().tagKind() + ", not a string");
    }
    const std::string key = entry.key().toStringRef();
    const std::string at = fmt::format("{}: '{}'", where, key);
    if (key == "params" || ignored_group_keys().count(key) != 0) {
      continue;
    }
    bool fixed = false;
    for (const auto& [name, value] : spec.fixed) {
      if (name == key) {
        fixed = true;
        if (!entry.value().isBool() || entry.value().toBool() != value) {
          fail(at, fmt::format("{} needs {}, got {}", Opt::kName, value ? "True" : "False",
                               c10::str(entry.value())));
        }
      }
    }
    if (fixed) {
      continue;
    }
    const auto* field = Options::binding().fields().find(key);
    if (field == nullptr) {
      fail(where, fmt::format("unknown key '{}' ({} takes {}; ignored: {})", key, Opt::kName,
                              fmt::join(binding.keys(), ", "), fmt::join(ignored_group_keys(), ", ")));
    }
    const auto value = arg_value(entry.value(), at);
    if (value && !field->read(*value, options)) {
      fail(at, fmt::format("expected {}, got {}", field->expected, value->to_string()));
    }
  }
  try {
    Opt::validate(options);
  } catch (const std::invalid_argument& e) {
    fail(where, e.what());
  }
  return options;
}

template <class Opt>
void load_into(Opt& optimizer, const IValue& state_dict, const std::string& source) {
  using State = typename Opt::param_state_type;
  using Options = typename Opt::options_type;
  const StateSpec<Opt> spec = spec_of(&optimizer);
  if (!state_dict.isGenericDict()) {
    fail(source, fmt::format("holds a {}, not a torch.optim state_dict", state_dict.tagKind()));
  }
  const auto top = state_dict.toGenericDict();
  const IValue& groups_value = item(top, "param_groups", source);
  const IValue& state_value = item(top, "state", source);
  if (!groups_value.isList() || !state_value.isGenericDict()) {
    fail(source, "not a torch.optim state_dict: 'param_groups' is not a list or 'state' not a dict");
  }
  const auto groups = groups_value.toListRef();
  auto& ours = optimizer.param_groups();
  if (groups.size() != ours.size()) {
    fail(source, fmt::format("{} param groups in the file, the optimizer has {}", groups.size(), ours.size()));
  }

  // Options of every group, and where each of the file's parameter ids is.
  std::vector<Options> options;
  std::map<int64_t, std::pair<size_t, size_t>> place;  // id -> (group, index)
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string where = fmt::format("{}: param group {}", source, g);
    if (!groups[g].isGenericDict()) {
      fail(where, std::string("a ") + groups[g].tagKind() + ", not a dict");
    }
    const auto group = groups[g].toGenericDict();
    const IValue& ids = item(group, "params", where);
    if (!ids.isList()) {
      fail(where, "'params' is not a list");
    }
    const auto id_list = ids.toListRef();
    if (id_list.size() != ours[g].params().size()) {
      fail(where, fmt::format("{} parameters in the file, the optimizer's group has {}", id_list.size(),
                              ours[g].params().size()));
    }
    for (size_t i = 0; i < id_list.size(); ++i) {
      if (!id_list[i].isInt() || !place.emplace(id_list[i].toInt(), std::make_pair(g, i)).second) {
        fail(where, fmt::format("'params'[{}] is not an integer id of its own: {}", i, c10::str(id_list[i])));
      }
    }
    options.push_back(group_options<Opt>(static_cast<const Options&>(ours[g].options()), group, spec, where));
  }

  // The state of every parameter the file has state for.
  std::vector<std::pair<void*, std::unique_ptr<State>>> states;
  for (const auto& entry : state_value.toGenericDict()) {
    if (!entry.key().isInt() || place.count(entry.key().toInt()) == 0) {
      fail(source, fmt::format("state for {}, which no param group lists", c10::str(entry.key())));
    }
    const int64_t id = entry.key().toInt();
    const auto [g, i] = place.at(id);
    const at::Tensor& param = ours[g].params()[i];
    const std::string where = fmt::format("{}: param group {}, parameter {} (id {})", source, g, i, id);
    if (!entry.value().isGenericDict()) {
      fail(where, std::string("its state is a ") + entry.value().tagKind() + ", not a dict");
    }
    const auto file_state = entry.value().toGenericDict();
    std::vector<std::string> names;
    for (const auto& key : spec.keys) {
      names.push_back(key.name);
    }
    for (const auto& kv : file_state) {
      const std::string name = kv.key().isString() ? kv.key().toStringRef() : c10::str(kv.key());
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        fail(where, fmt::format("unknown state key '{}' ({} keeps {})", name, Opt::kName, fmt::join(names, ", ")));
      }
    }
    auto state = std::make_unique<State>();
    for (const auto& key : spec.keys) {
      const auto it = file_state.find(IValue(key.name));
      if (it == file_state.end() || it->value().isNone()) {
        if (!key.required || key.required(options[g])) {
          fail(where, fmt::format("missing state key '{}'", key.name));
        }
        continue;
      }
      key.read(*state, it->value(), param, fmt::format("{}: '{}'", where, key.name));
    }
    states.emplace_back(param.unsafeGetTensorImpl(), std::move(state));
  }

  // Everything read and checked: only now is the optimizer changed.
  for (size_t g = 0; g < ours.size(); ++g) {
    ours[g].set_options(std::make_unique<Options>(options[g]));
    for (const auto& p : ours[g].params()) {
      optimizer.state().erase(p.unsafeGetTensorImpl());
    }
  }
  for (auto& [key, state] : states) {
    optimizer.state()[key] = std::move(state);
  }
}

template <class Opt>
bool try_load(torch::optim::Optimizer& optimizer, const IValue& state_dict, const std::string& source) {
  auto* typed = dynamic_cast<Opt*>(&optimizer);
  if (typed == nullptr) {
    return false;
  }
  load_into(*typed, state_dict, source);
  return true;
}

}  // namespace python_state
}  // namespace

void load_torch_state(torch::optim::Optimizer& optimizer, const c10::IValue& state_dict, const std::string& source) {
  using python_state::try_load;
  if (!(try_load<Adam>(optimizer, state_dict, source) || try_load<AdamW>(optimizer, state_dict, source) ||
        try_load<Sgd>(optimizer, state_dict, source) || try_load<RAdam>(optimizer, state_dict, source) ||
        try_load<NAdam>(optimizer, state_dict, source) || try_load<Adamax>(optimizer, state_dict, source) ||
        try_load<Adagrad>(optimizer, state_dict, source) || try_load<Adadelta>(optimizer, state_dict, source) ||
        try_load<Asgd>(optimizer, state_dict, source) || try_load<Rprop>(optimizer, state_dict, source))) {
    python_state::fail(source,
                       "load_torch_state takes Adam, AdamW, Sgd, RAdam, NAdam, Adamax, Adagrad, Adadelta, Asgd or "
                       "Rprop, not this optimizer");
  }
}

void load_torch_state(torch::optim::Optimizer& optimizer, const std::string& path) {
  load_torch_state(optimizer, io::load_pt_object(path), path);
}

}  // namespace trainkit::optim
