#pragma once
/// @file
/// Evaluation metrics: update per batch, compute at the end, reset between passes, and reduced across
/// data-parallel ranks through their sufficient statistics (a float64 tensor that sums across ranks).
///
///   trainer.set_metrics({train::accuracy(), train::top_k_accuracy(5)});
///   auto r = trainer.evaluate(val);  // r.metric("accuracy"), r.metric("top5_accuracy"), r.loss
///
/// A user metric subclasses Metric, or is a MeanMetric built from a function that returns the batch's
/// (sum, count) pair.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "trainkit/data/batch.h"
#include "trainkit/options.h"

namespace trainkit::train {

/// A quantity accumulated over the batches of one evaluation pass.
class Metric {
 public:
  virtual ~Metric() = default;
  /// The name under which it is reported ("accuracy" → "val/accuracy", column "val_accuracy").
  virtual std::string name() const = 0;
  /// Adds one batch: the model output and the batch it came from (targets are batch.target(...)).
  virtual void update(const at::Tensor& output, const data::Batch& batch) = 0;
  /// The value over every batch since reset().
  virtual double compute() const = 0;
  /// Forgets every batch.
  virtual void reset() = 0;
  /// Sufficient statistics: a 1-D float64 tensor, on the device the updates ran on (reading it is the
  /// caller's copy), whose element-wise sum over ranks is the state of the whole data set (e.g. [correct, count]).
  virtual at::Tensor state() const = 0;
  /// Replaces the statistics (with the sum over ranks).
  virtual void set_state(const at::Tensor& state) = 0;
};

/// A metric that is the mean of a per-sample (or per-element) quantity: update adds the batch's (sum,
/// count), compute returns sum / count. Sums stay on the output's device until compute().
class MeanMetric : public Metric {
 public:
  /// `fn(output, batch)` returns a float64 tensor [sum, count] for one batch.
  using SumFn = std::function<at::Tensor(const at::Tensor& output, const data::Batch& batch)>;
  MeanMetric(std::string name, SumFn fn);
  std::string name() const override { return name_; }
  void update(const at::Tensor& output, const data::Batch& batch) override;
  double compute() const override;
  void reset() override;
  at::Tensor state() const override;
  void set_state(const at::Tensor& state) override;

 private:
  std::string name_;
  SumFn fn_;
  at::Tensor sums_;  // [sum, count], float64, undefined after reset()
};

/// Fraction of samples whose argmax over dim 1 of the output equals target 0 (classification).
/// Throws std::invalid_argument naming the shapes for an output that is not [B, C, ...].
std::shared_ptr<Metric> accuracy();
/// Fraction of samples whose target 0 is among the k largest outputs (named "top{k}_accuracy").
std::shared_ptr<Metric> top_k_accuracy(int64_t k);
/// Mean absolute error between output and target 0 over every element ("mae").
std::shared_ptr<Metric> mean_absolute_error();
/// Mean squared error between output and target 0 over every element ("mse").
std::shared_ptr<Metric> mean_squared_error();
/// The metric registered under `name` ("accuracy", "top5_accuracy" (any k), "mae", "mse"); throws
/// std::invalid_argument listing the known names.
std::shared_ptr<Metric> make_metric(const std::string& name);
/// An array of distinct names that make_metric knows (the rule of a list of metrics, trainkit/options.h); an
/// unknown name throws std::invalid_argument saying which.
ValueRule<std::vector<std::string>> metric_names_rule();

/// Named metric values in a fixed order.
class MetricValues {
 public:
  /// Appends (or replaces) `name`.
  void set(const std::string& name, double value);
  /// The value of `name`, if present.
  std::optional<double> find(const std::string& name) const;
  /// The value of `name`; throws std::out_of_range listing the names present.
  double at(const std::string& name) const;
  /// Every (name, value), in insertion order.
  const std::vector<std::pair<std::string, double>>& items() const { return items_; }
  bool empty() const { return items_.empty(); }

 private:
  std::vector<std::pair<std::string, double>> items_;
};

}  // namespace trainkit::train
