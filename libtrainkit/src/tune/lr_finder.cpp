#include "trainkit/tune/lr_finder.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

#include "detail/check.h"
#include "trainkit/amp/autocast.h"
#include "trainkit/log/svg_plot.h"
#include "tune/detail/snapshot.h"

namespace trainkit::tune {
namespace {

void set_why(std::string* why, std::string text) {
  if (why != nullptr) {
    *why = std::move(text);
  }
}

void check_options(const LRFinderOptions& o) {
  const auto bad = [](const std::string& name, double v, const std::string& expected) {
    throw std::invalid_argument(fmt::format("LRFinder: invalid {}: {} ({})", name, v, expected));
  };
  if (!(o.start_lr() > 0)) bad("start_lr", o.start_lr(), "must be > 0");
  if (!(o.end_lr() > o.start_lr())) bad("end_lr", o.end_lr(), "must be > start_lr");
  if (o.num_iter() < 2) bad("num_iter", static_cast<double>(o.num_iter()), "must be >= 2");
  if (!(o.smooth_f() >= 0 && o.smooth_f() < 1)) bad("smooth_f", o.smooth_f(), "must be in [0, 1)");
  if (!(o.diverge_th() > 1)) bad("diverge_th", o.diverge_th(), "must be > 1");
  if (o.accumulation_steps() < 1) bad("accumulation_steps", static_cast<double>(o.accumulation_steps()), "must be >= 1");
  if (o.step_mode() != "exp" && o.step_mode() != "linear") {
    throw std::invalid_argument("LRFinder: invalid step_mode: " + o.step_mode() + " (\"exp\" or \"linear\")");
  }
}

}  // namespace

int64_t LRFinderResult::skipped_steps() const {
  return static_cast<int64_t>(std::count(skipped.begin(), skipped.end(), true));
}

LRFinder::LRFinder(std::shared_ptr<torch::nn::Module> module, ForwardFn forward, torch::optim::Optimizer& optimizer,
                   LossFn loss)
    : module_(std::move(module)), forward_(std::move(forward)), optimizer_(optimizer), loss_(std::move(loss)) {
  if (!loss_) {
    loss_ = train::cross_entropy_loss();
  }
  if (!forward_) {
    throw std::invalid_argument("LRFinder: the forward function must not be empty");
  }
}

void LRFinder::set_autocast(c10::DeviceType device, c10::ScalarType dtype) {
  TRAINKIT_CHECK_ARG(amp::is_autocast_dtype_supported(device, dtype),
                     "LRFinder::set_autocast: {} autocast is not supported on {}", c10::toString(dtype),
                     c10::DeviceTypeName(device));
  autocast_ = std::make_pair(device, dtype);
}

LRFinderResult LRFinder::range_test(data::BatchSource& train, data::BatchSource* val,
                                    const LRFinderOptions& options) {
  check_options(options);
  TRAINKIT_CHECK_ARG(scaler_ == nullptr || scaler_->stage(optimizer_) == amp::OptState::READY,
                     "LRFinder: the GradScaler is in the middle of an iteration of this optimizer; call its "
                     "update() before the range test");
  detail::Snapshot snapshot(*module_, optimizer_, scaler_.get());
  LRFinderResult r;
  try {
    int64_t epoch = 0;
    train.set_epoch(epoch);
    const auto next_batch = [&] {
      std::optional<data::Batch> b = train.next();
      if (!b) {
        train.set_epoch(++epoch);
        b = train.next();
        if (!b) {
          throw std::invalid_argument(fmt::format("LRFinder: the training source yielded no batch in epoch {}", epoch));
        }
      }
      return std::move(*b);
    };
    double best = 0;
    const int64_t n = options.num_iter();
    for (int64_t i = 0; i < n; ++i) {
      const double t = static_cast<double>(i) / static_cast<double>(n - 1);
      const double lr = options.step_mode() == "exp"
                            ? options.start_lr() * std::pow(options.end_lr() / options.start_lr(), t)
                            : options.start_lr() + t * (options.end_lr() - options.start_lr());
      for (auto& g : optimizer_.param_groups()) {
        g.options().set_lr(lr);
      }
      module_->train();
      optimizer_.zero_grad();
      const double scale = scaler_ != nullptr ? scaler_->get_scale() : 1.0;
      // torch-lr-finder's _train_batch: the micro-batch losses are summed as tensors in the loss's dtype
      // (one host read per step); with a scaler, each backward is of the scaled loss and the step and the
      // scale update happen once, after the last micro-batch.
      at::Tensor total;
      for (int64_t k = 0; k < options.accumulation_steps(); ++k) {
        const auto b = next_batch();
        at::Tensor l;
        {
          std::optional<amp::Autocast> region;
          if (autocast_) {
            region.emplace(autocast_->first, autocast_->second);
          }
          l = loss_(forward_(b), b);
        }
        if (autocast_) {
          l = amp::loss_for_backward(l);  // as the Trainer does: reported and scaled from float32
        }
        l = l / static_cast<double>(options.accumulation_steps());
        (scaler_ != nullptr ? scaler_->scale(l) : l).backward();
        total = total.defined() ? total + l.detach() : l.detach();
      }
      bool skipped = false;
      if (scaler_ != nullptr) {
        skipped = !scaler_->step(optimizer_);
        scaler_->update();
      } else {
        optimizer_.step();
      }
      double loss = total.item<double>();
      if (val != nullptr) {
        // Validation measures the weights in full precision, without autocast (torch-lr-finder's _validate).
        module_->eval();
        torch::NoGradGuard no_grad;
        double sum = 0;
        int64_t count = 0;
        val->set_epoch(0);
        while (const auto b = val->next()) {
          sum += loss_(forward_(*b), *b).item<double>() * static_cast<double>(b->size());
          count += b->size();
        }
        if (count == 0) {
          throw std::invalid_argument("LRFinder: the validation source yielded no batch");
        }
        loss = sum / static_cast<double>(count);
      }
      r.lrs.push_back(lr);
      r.losses.push_back(loss);
      r.skipped.push_back(skipped);
      r.scales.push_back(scale);
      // A skipped step's loss is a measurement like any other (of the weights before the step), so it is
      // smoothed and checked for divergence as torch-lr-finder does.
      double smoothed = loss;
      if (i == 0) {
        best = loss;
      } else {
        if (options.smooth_f() > 0) {
          smoothed = options.smooth_f() * loss + (1 - options.smooth_f()) * r.smoothed_losses.back();
        }
        best = std::min(best, smoothed);
      }
      r.smoothed_losses.push_back(smoothed);
      if (smoothed > options.diverge_th() * best || !std::isfinite(smoothed)) {
        r.diverged = true;
        break;
      }
    }
  } catch (...) {
    snapshot.restore();
    throw;
  }
  snapshot.restore();
  return r;
}

std::optional<Suggestion> suggest_steepest(const LRFinderResult& r, std::string* why, int64_t skip_start,
                                           int64_t skip_end) {
  const auto n = static_cast<int64_t>(r.smoothed_losses.size());
  if (n < skip_start + skip_end + 2) {
    set_why(why, fmt::format("steepest: need at least {} points, the test recorded {} (it diverged early or "
                             "num_iter is small)",
                             skip_start + skip_end + 2, n));
    return std::nullopt;
  }
  std::vector<double> y(r.smoothed_losses.begin() + skip_start, r.smoothed_losses.end() - skip_end);
  const auto m = static_cast<int64_t>(y.size());
  // numpy.gradient with unit spacing: one-sided at the ends, central inside.
  int64_t best = -1;
  double best_grad = 0;
  for (int64_t i = 0; i < m; ++i) {
    const double g = i == 0 ? y[1] - y[0] : (i == m - 1 ? y[static_cast<size_t>(m - 1)] - y[static_cast<size_t>(m - 2)]
                                                         : (y[static_cast<size_t>(i + 1)] - y[static_cast<size_t>(i - 1)]) / 2.0);
    if (std::isfinite(g) && (best < 0 || g < best_grad)) {
      best = i;
      best_grad = g;
    }
  }
  if (best < 0 || !(best_grad < 0)) {
    set_why(why, "steepest: the smoothed loss never decreases in the tested range; try a lower start_lr");
    return std::nullopt;
  }
  const int64_t index = best + skip_start;
  return Suggestion{r.lrs[static_cast<size_t>(index)], index, "steepest"};
}

std::optional<Suggestion> suggest_valley(const LRFinderResult& r, std::string* why) {
  const auto& losses = r.smoothed_losses;
  const auto n = static_cast<int64_t>(losses.size());
  if (n < 2) {
    set_why(why, "valley: need at least 2 points");
    return std::nullopt;
  }
  // Longest decreasing subsequence ending at each point (fastai's valley).
  std::vector<int64_t> lds(static_cast<size_t>(n), 1);
  int64_t max_start = 0;
  int64_t max_end = 0;
  for (int64_t i = 1; i < n; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      if (losses[static_cast<size_t>(i)] < losses[static_cast<size_t>(j)] &&
          lds[static_cast<size_t>(i)] < lds[static_cast<size_t>(j)] + 1) {
        lds[static_cast<size_t>(i)] = lds[static_cast<size_t>(j)] + 1;
      }
      if (lds[static_cast<size_t>(max_end)] < lds[static_cast<size_t>(i)]) {
        max_end = i;
        max_start = max_end - lds[static_cast<size_t>(max_end)];
      }
    }
  }
  if (max_end == 0) {
    set_why(why, "valley: the smoothed loss never decreases in the tested range; try a lower start_lr");
    return std::nullopt;
  }
  const double sections = static_cast<double>(max_end - max_start) / 3.0;
  const int64_t index = std::clamp<int64_t>(
      max_start + static_cast<int64_t>(sections) + static_cast<int64_t>(sections / 2), 0, n - 1);
  return Suggestion{r.lrs[static_cast<size_t>(index)], index, "valley"};
}

std::optional<Suggestion> suggest_minimum(const LRFinderResult& r, std::string* why) {
  if (r.smoothed_losses.empty()) {
    set_why(why, "minimum: the test recorded no points");
    return std::nullopt;
  }
  size_t best = 0;
  for (size_t i = 1; i < r.smoothed_losses.size(); ++i) {
    if (r.smoothed_losses[i] < r.smoothed_losses[best]) {
      best = i;
    }
  }
  const double lr = std::max(r.lrs[best] / 10.0, r.lrs.front());
  size_t index = 0;
  while (index + 1 < r.lrs.size() && r.lrs[index + 1] <= lr) {
    ++index;
  }
  return Suggestion{lr, static_cast<int64_t>(index), "minimum/10"};
}

void write_lr_finder_csv(const LRFinderResult& r, const std::string& path) {
  std::ofstream out(path);
  if (!out) {
    throw std::runtime_error(path + ": cannot open for writing");
  }
  out << "lr,loss,smoothed_loss,skipped,scale\n";
  for (size_t i = 0; i < r.lrs.size(); ++i) {
    // A result assembled by hand may lack the scaler's columns: no skip, scale 1.
    const bool skipped = i < r.skipped.size() && r.skipped[i];
    const double scale = i < r.scales.size() ? r.scales[i] : 1.0;
    out << fmt::format("{:.9g},{:.9g},{:.9g},{:d},{:.9g}\n", r.lrs[i], r.losses[i], r.smoothed_losses[i],
                       skipped ? 1 : 0, scale);
  }
}

void write_lr_finder_svg(const LRFinderResult& r, const std::vector<Suggestion>& suggestions,
                         const std::string& path, const std::string& title) {
  log::SvgPlot plot(log::PlotOptions().title(title).x_label("learning rate").y_label("loss (smoothed)").log_x(true));
  plot.add_series({"smoothed loss", r.lrs, r.smoothed_losses, false});
  for (const auto& s : suggestions) {
    plot.add_marker(s.lr, r.smoothed_losses[static_cast<size_t>(s.index)], fmt::format("{} {:.2g}", s.method, s.lr));
  }
  plot.save(path);
}

}  // namespace trainkit::tune
