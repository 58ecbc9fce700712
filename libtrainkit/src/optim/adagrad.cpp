#include "trainkit/optim/adagrad.h"

#include <torch/optim/serialize.h>

#include "optim/detail/common.h"
#include "optim/detail/gather.h"
#include "trainkit/optim/factory.h"

namespace trainkit::optim {

void AdagradParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(sum);
}

void AdagradParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, sum);
}

namespace {

using AdagradGroup = detail::Gathered<AdagradParamState>;

/// -lr / (1 + (t - 1)·lr_decay), the negated step size of step t.
double neg_clr(const AdagradOptions& o, int64_t step) {
  return -o.lr() / (1 + static_cast<double>(step - 1) * o.lr_decay());
}

/// The fused step of one group of float32 or float64 tensors (T).
template <class T>
void adagrad_fused_group(const AdagradGroup& g, const std::vector<at::Tensor>& sums, const AdagradOptions& o, double grad_mul) {
  std::vector<detail::AdagradCoef<T>> coefs;
  for (const AdagradParamState* s : g.states) {
    coefs.push_back({static_cast<T>(grad_mul), static_cast<T>(o.weight_decay()), static_cast<T>(o.eps()),
                     static_cast<T>(neg_clr(o, s->step()))});
  }
  detail::for_each_even(detail::numels_of(g.params), [&](const detail::Chunk& c) {
    const auto t = static_cast<size_t>(c.tensor);
    detail::adagrad_kernel(g.params[t].data_ptr<T>() + c.begin, g.grads[t].data_ptr<T>() + c.begin,
                           sums[t].data_ptr<T>() + c.begin, c.n, coefs[t]);
  });
}

/// PyTorch's single-tensor Adagrad op for op (`foreach`: the same ops over the whole group). Any device.
void adagrad_tensor_group(const AdagradGroup& g, std::vector<at::Tensor> sums, const AdagradOptions& o, const at::Tensor& inv_scale,
                  bool foreach) {
  std::vector<at::Tensor> params = g.params;
  const auto grads = detail::effective_grads(g.grads, params, inv_scale, o.maximize(), o.weight_decay(), foreach);
  std::vector<at::Scalar> step_sizes;
  for (const AdagradParamState* s : g.states) {
    step_sizes.emplace_back(neg_clr(o, s->step()));
  }
  if (foreach) {
    at::_foreach_addcmul_(sums, grads, grads, 1);
    auto denom = at::_foreach_sqrt(sums);
    at::_foreach_add_(denom, o.eps());
    at::_foreach_addcdiv_(params, grads, denom, step_sizes);
    return;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    sums[i].addcmul_(grads[i], grads[i], 1);
    params[i].addcdiv_(grads[i], sums[i].sqrt().add_(o.eps()), step_sizes[i]);
  }
}

}  // namespace

bool register_adagrad_optimizer() {
  register_optimizer(OptimizerBinding<Adagrad>("adagrad").entry());
  return true;
}

void Adagrad::update(const at::Tensor& inv_scale) {
  const auto init = [](AdagradParamState& s, const at::Tensor& p, const AdagradOptions& o) {
    s.sum(at::full_like(p, o.initial_accumulator_value(), at::MemoryFormat::Preserve));
  };
  detail::for_each_group(*this, init, [&](size_t gi, const AdagradOptions& o, AdagradGroup& g) {
    const auto sums = g.of([](AdagradParamState& s) { return s.sum(); });
    std::vector<at::Tensor> values = g.values();
    values.insert(values.end(), sums.begin(), sums.end());
    if (internal::use_foreach(o.foreach(), o.fused(), values, kName, gi)) {
      adagrad_tensor_group(g, sums, o, inv_scale, /*foreach=*/true);
      return;
    }
    dispatch(
        o.fused(), values, gi,
        [&](auto type) {
          const double grad_mul = (o.maximize() ? -1.0 : 1.0) * detail::cpu_scalar(inv_scale, 1.0);
          adagrad_fused_group<decltype(type)>(g, sums, o, grad_mul);
        },
        [&] { adagrad_tensor_group(g, sums, o, inv_scale, /*foreach=*/false); });
  });
}

}  // namespace trainkit::optim
