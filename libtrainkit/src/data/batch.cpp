#include "trainkit/data/batch.h"

#include <algorithm>
#include <stdexcept>

#include <torch/torch.h>

#include "detail/check.h"

namespace trainkit::data {
namespace {

const at::Tensor& by_index(const std::vector<at::Tensor>& tensors, size_t index, const char* what) {
  if (index >= tensors.size()) {
    throw std::out_of_range(fmt::format("Batch: no {} {} (the batch has {})", what, index, tensors.size()));
  }
  return tensors[index];
}

const at::Tensor& by_name(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& names,
                          const std::string& name, const char* what) {
  const auto it = std::find(names.begin(), names.end(), name);
  if (name.empty() || it == names.end()) {
    std::string known;
    for (const auto& n : names) {
      if (!n.empty()) {
        known += (known.empty() ? "" : ", ") + n;
      }
    }
    throw std::out_of_range(fmt::format("Batch: no {} named \"{}\" (named {}s: {})", what, name, what,
                                        known.empty() ? "none" : known));
  }
  return tensors[static_cast<size_t>(it - names.begin())];
}

void append(std::vector<at::Tensor>& tensors, std::vector<std::string>& names, at::Tensor tensor, std::string name,
            const char* what) {
  TRAINKIT_CHECK_ARG(name.empty() || std::find(names.begin(), names.end(), name) == names.end(),
                     "Batch: a second {} named \"{}\"", what, name);
  tensors.push_back(std::move(tensor));
  names.push_back(std::move(name));
}

}  // namespace

Batch::Batch(at::Tensor input, at::Tensor target)
    : inputs_{std::move(input)}, targets_{std::move(target)}, input_names_(1), target_names_(1) {}

Batch::Batch(std::vector<at::Tensor> inputs, std::vector<at::Tensor> targets)
    : inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      input_names_(inputs_.size()),
      target_names_(targets_.size()) {}

Batch& Batch::add_input(at::Tensor tensor, std::string name) {
  append(inputs_, input_names_, std::move(tensor), std::move(name), "input");
  return *this;
}

Batch& Batch::add_target(at::Tensor tensor, std::string name) {
  append(targets_, target_names_, std::move(tensor), std::move(name), "target");
  return *this;
}

const at::Tensor& Batch::input(size_t index) const { return by_index(inputs_, index, "input"); }
const at::Tensor& Batch::input(const std::string& name) const {
  return by_name(inputs_, input_names_, name, "input");
}
const at::Tensor& Batch::target(size_t index) const { return by_index(targets_, index, "target"); }
const at::Tensor& Batch::target(const std::string& name) const {
  return by_name(targets_, target_names_, name, "target");
}
bool Batch::has_input(const std::string& name) const {
  return !name.empty() && std::find(input_names_.begin(), input_names_.end(), name) != input_names_.end();
}
bool Batch::has_target(const std::string& name) const {
  return !name.empty() && std::find(target_names_.begin(), target_names_.end(), name) != target_names_.end();
}

int64_t Batch::size() const {
  for (const auto* list : {&inputs_, &targets_}) {
    for (const auto& t : *list) {
      if (t.defined()) {
        return t.dim() == 0 ? 1 : t.size(0);
      }
    }
  }
  return 0;
}

Batch Batch::map(const std::function<at::Tensor(const at::Tensor&)>& f) const {
  Batch out = *this;
  for (auto* list : {&out.inputs_, &out.targets_}) {
    for (auto& t : *list) {
      if (t.defined()) {
        t = f(t);
      }
    }
  }
  return out;
}

Batch Batch::to(const c10::Device& device, bool non_blocking) const {
  return map([&](const at::Tensor& t) { return t.to(device, non_blocking); });
}

Batch Batch::pin_memory() const {
  return map([](const at::Tensor& t) { return t.is_pinned() ? t : t.pin_memory(); });
}

bool Batch::is_pinned() const {
  for (const auto* list : {&inputs_, &targets_}) {
    for (const auto& t : *list) {
      if (t.defined() && !t.is_pinned()) {
        return false;
      }
    }
  }
  return true;
}

Batch collate_stack(const std::vector<Batch>& samples) {
  TRAINKIT_CHECK_ARG(!samples.empty(), "collate_stack: no samples to collate");
  const Batch& first = samples.front();
  Batch out;
  const auto stack_position = [&](bool input, size_t pos) {
    std::vector<at::Tensor> parts;
    parts.reserve(samples.size());
    for (size_t s = 0; s < samples.size(); ++s) {
      const auto& list = input ? samples[s].inputs() : samples[s].targets();
      const at::Tensor& ref = input ? first.input(pos) : first.target(pos);
      const at::Tensor& t = list[pos];
      TRAINKIT_CHECK_ARG(t.defined() && t.sizes() == ref.sizes() && t.scalar_type() == ref.scalar_type(),
                         "collate_stack: sample {} {} {} is {} {} but sample 0's is {} {}", s,
                         input ? "input" : "target", pos, t.defined() ? c10::toString(t.scalar_type()) : "undefined",
                         t.defined() ? c10::str(t.sizes()) : "", c10::toString(ref.scalar_type()), c10::str(ref.sizes()));
      parts.push_back(t);
    }
    return torch::stack(parts);
  };
  for (size_t s = 0; s < samples.size(); ++s) {
    TRAINKIT_CHECK_ARG(samples[s].inputs().size() == first.inputs().size() &&
                           samples[s].targets().size() == first.targets().size(),
                       "collate_stack: sample {} has {} inputs and {} targets but sample 0 has {} and {}", s,
                       samples[s].inputs().size(), samples[s].targets().size(), first.inputs().size(),
                       first.targets().size());
  }
  for (size_t i = 0; i < first.inputs().size(); ++i) {
    out.add_input(stack_position(true, i), first.input_names()[i]);
  }
  for (size_t i = 0; i < first.targets().size(); ++i) {
    out.add_target(stack_position(false, i), first.target_names()[i]);
  }
  return out;
}

}  // namespace trainkit::data
