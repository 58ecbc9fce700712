#pragma once
/// @file
/// Metrics files: the same rows as CSV (`metrics.csv`) and JSON Lines (`metrics.jsonl`).

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace trainkit::log {

/// One row of training metrics. Optional fields are empty in CSV and absent in JSONL.
struct MetricRow {
  std::string kind;                          ///< "train" (every N steps), "epoch" (end of an epoch) or "test"
  int64_t step = 0;                          ///< optimizer steps taken so far
  int64_t epoch = 0;                         ///< epoch the row belongs to
  std::optional<double> loss;                ///< training loss, the mean over the interval or the epoch
  std::optional<double> lr;                  ///< learning rate of param group 0
  std::optional<double> samples_per_second;  ///< training throughput over the interval
  std::optional<double> val_loss;            ///< validation loss, or test loss in a "test" row
  std::optional<double> val_accuracy;        ///< validation accuracy, or test accuracy in a "test" row
};

/// Appends MetricRows to `DIR/metrics.csv` and `DIR/metrics.jsonl`, flushing each row so that a
/// killed run keeps every row written before it died.
class MetricsWriter {
 public:
  /// Opens (appending, when `append`) both files in `dir`; writes the CSV header to a new file.
  MetricsWriter(const std::string& dir, bool append);
  /// Writes one row to both files.
  void write(const MetricRow& row);

 private:
  std::ofstream csv_;
  std::ofstream jsonl_;
};

}  // namespace trainkit::log

namespace trainkit::log {

/// Draws `DIR/metrics.csv` (as MetricsWriter writes it) into one SVG with three stacked plots: training
/// and validation loss, validation accuracy, and learning rate, against the step.
/// Throws std::runtime_error naming the file when it cannot be read or written.
void write_curves_svg(const std::string& metrics_csv, const std::string& svg_path, const std::string& title);

}  // namespace trainkit::log
