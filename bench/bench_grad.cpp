// bench_grad: trainkit::grad::clip_grad_norm_ against LibTorch's torch::nn::utils::clip_grad_norm_ and
// against a floor — ATen's norm over one contiguous buffer of the same bytes — side by side in one run,
// variants interleaved, medians reported. Cases: 10M params in 16 tensors and 1M params in 256 tensors,
// each when no clipping is needed (max_norm large) and when it is (max_norm small).
#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/amp/grad_scaler.h"
#include "trainkit/app/cli.h"
#include "trainkit/app/stats.h"
#include "trainkit/grad/clip.h"
#include "trainkit/optim/adam.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<at::Tensor> make_params(int64_t total, int64_t count) {
  torch::manual_seed(0);
  std::vector<at::Tensor> params;
  for (int64_t i = 0; i < count; ++i) {
    at::Tensor p = torch::zeros({total / count}).requires_grad_();
    p.mutable_grad() = torch::randn({total / count}) * 1e-3;
    params.push_back(p);
  }
  return params;
}

double time_it(const std::function<void()>& f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

using trainkit::app::median;

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"clip_grad_norm_: trainkit vs torch::nn::utils vs a one-pass floor"};
  int rounds = 31;
  int threads = 0;
  std::string json_path;
  cli.option("--rounds", rounds, "Interleaved rounds per case (median reported)").show_default();
  cli.option("--threads", threads, "Intra-op threads (0 = LibTorch's default)").show_default();
  cli.option("--json", json_path, "Also write the results as JSON");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  if (threads > 0) {
    torch::set_num_threads(threads);
  }
  fmt::print("clip_grad_norm_ (float32, CPU, {} threads), median of {} interleaved rounds, milliseconds\n",
             torch::get_num_threads(), rounds);
  fmt::print("{:<26} {:>10} {:>12} {:>10} {:>16} {:>14}\n", "case", "trainkit", "torch::nn", "floor",
             "torch/trainkit", "trainkit/floor");
  std::string json = "[";
  struct Case {
    const char* name;
    int64_t total;
    int64_t count;
    double max_norm;
  };
  for (const Case c : {Case{"10M/16, no clip needed", 10'000'000, 16, 1e9}, Case{"10M/16, clipping", 10'000'000, 16, 1e-3},
                       Case{"1M/256, no clip needed", 1'048'576, 256, 1e9}, Case{"1M/256, clipping", 1'048'576, 256, 1e-3}}) {
    auto params = make_params(c.total, c.count);
    const at::Tensor flat = torch::randn({c.total}) * 1e-3;
    std::map<std::string, std::vector<double>> t;
    // Clipping scales the gradients down; restore them between rounds (outside the timed region) so
    // every round clips the same values.
    std::vector<at::Tensor> saved;
    for (const auto& p : params) {
      saved.push_back(p.grad().clone());
    }
    const auto restore = [&] {
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].mutable_grad().copy_(saved[i]);
      }
    };
    for (int r = -2; r < rounds; ++r) {  // two warm-up rounds
      restore();
      const double a = time_it([&] { trainkit::grad::clip_grad_norm_(params, c.max_norm).item<double>(); });
      restore();
      const double b = time_it([&] { torch::nn::utils::clip_grad_norm_(params, c.max_norm); });
      const double f = time_it([&] { at::linalg_vector_norm(flat, 2).item<double>(); });
      if (r >= 0) {
        t["trainkit"].push_back(a);
        t["torch"].push_back(b);
        t["floor"].push_back(f);
      }
    }
    const double a = median(t["trainkit"]) * 1e3;
    const double b = median(t["torch"]) * 1e3;
    const double f = median(t["floor"]) * 1e3;
    fmt::print("{:<26} {:>10.3f} {:>12.3f} {:>10.3f} {:>16.2f} {:>14.2f}\n", c.name, a, b, f, b / a, a / f);
    json += fmt::format("{}{{\"case\": \"{}\", \"trainkit_ms\": {:.4f}, \"torch_ms\": {:.4f}, \"floor_ms\": {:.4f}}}",
                        json.size() > 1 ? ", " : "", c.name, a, b, f);
  }
  json += "]";

  // GradScaler overhead on an Adam step, 10M float32 params in 16 tensors. PyTorch's fused CPU Adam
  // (at::_fused_adam_) takes grad_scale/found_inf and unscales inside its single pass; the scaler then
  // only adds the inf/NaN check pass (as Python's GradScaler does for fused optimizers).
  {
    auto params = make_params(10'000'000, 16);
    std::vector<at::Tensor> grads, m, v, steps;
    for (const auto& p : params) {
      grads.push_back(p.grad());
      m.push_back(torch::zeros_like(p));
      v.push_back(torch::zeros_like(p));
      steps.push_back(torch::zeros({}));
    }
    torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-3));
    trainkit::optim::Adam tk_adam(params, trainkit::optim::AdamOptions(1e-3));
    trainkit::amp::GradScaler tk_scaler(torch::kCPU, trainkit::amp::GradScalerOptions().init_scale(1.0));
    trainkit::amp::GradScaler scaler(torch::kCPU, trainkit::amp::GradScalerOptions().init_scale(1.0));
    const at::Tensor grad_scale = torch::ones({});
    const at::Tensor inv_scale = torch::ones({});
    const at::Tensor dummy = torch::ones({}, torch::requires_grad());
    std::map<std::string, std::vector<double>> t;
    for (int r = -2; r < rounds; ++r) {
      const double a = time_it([&] { adam.step(); });
      const double b = time_it([&] {
        scaler.scale(dummy);  // marks the scaler as in use; the gradients already carry scale 1
        scaler.step(adam);
        scaler.update();
      });
      const double c = time_it([&] {
        at::_fused_adam_(params, grads, m, v, {}, steps, 1e-3, 0.9, 0.999, 0.0, 1e-8, false, false);
      });
      const double d = time_it([&] {
        at::Tensor found_inf = torch::zeros({});
        at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
        at::_fused_adam_(params, grads, m, v, {}, steps, 1e-3, 0.9, 0.999, 0.0, 1e-8, false, false, grad_scale,
                         found_inf);
      });
      const double e = time_it([&] { tk_adam.step(); });
      const double f = time_it([&] {
        tk_scaler.scale(dummy);
        tk_scaler.step(tk_adam);  // read-only inf check + unscale inside the fused Adam pass
        tk_scaler.update();
      });
      if (r >= 0) {
        t["tk"].push_back(e);
        t["tk+scaler"].push_back(f);
        t["adam"].push_back(a);
        t["adam+scaler"].push_back(b);
        t["fused"].push_back(c);
        t["fused+scaler"].push_back(d);
      }
    }
    const double a = median(t["adam"]) * 1e3, b = median(t["adam+scaler"]) * 1e3;
    const double c = median(t["fused"]) * 1e3, d = median(t["fused+scaler"]) * 1e3;
    const double e = median(t["tk"]) * 1e3, f = median(t["tk+scaler"]) * 1e3;
    fmt::print("\nGradScaler overhead, Adam on 10M float32 params / 16 tensors, milliseconds\n");
    fmt::print("{:<44} {:>10} {:>10}\n", "variant", "ms", "ratio");
    fmt::print("{:<44} {:>10.3f} {:>10}\n", "torch::optim::Adam step", a, "1.00");
    fmt::print("{:<44} {:>10.3f} {:>10.2f}\n", "GradScaler unscale_+step+update, same Adam", b, b / a);
    fmt::print("{:<44} {:>10.3f} {:>10}\n", "at::_fused_adam_ (PyTorch's fused CPU Adam)", c, "1.00");
    fmt::print("{:<44} {:>10.3f} {:>10.2f}\n", "inf check + _fused_adam_(grad_scale, found_inf)", d, d / c);
    fmt::print("{:<44} {:>10.3f} {:>10}\n", "trainkit::optim::Adam (fused)", e, "1.00");
    fmt::print("{:<44} {:>10.3f} {:>10.2f}\n", "GradScaler step+update, same trainkit Adam", f, f / e);
    json = "{\"clip\": " + json + fmt::format(", \"scaler\": {{\"adam_ms\": {:.4f}, \"adam_scaler_ms\": {:.4f}, "
                                              "\"fused_ms\": {:.4f}, \"fused_scaler_ms\": {:.4f}, "
                                              "\"trainkit_adam_ms\": {:.4f}, \"trainkit_adam_scaler_ms\": {:.4f}}}}}",
                                              a, b, c, d, e, f);
  }
  json += "\n";
  if (!json_path.empty()) {
    std::ofstream(json_path) << json;
  }
  return 0;
}
