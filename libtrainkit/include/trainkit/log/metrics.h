#pragma once
/// @file
/// Metrics files: the same rows as CSV (`metrics.csv`) and JSON Lines (`metrics.jsonl`).

#include <cstdint>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trainkit::log {

/// One row of training metrics. Optional fields are empty in CSV and absent in JSONL. A non-finite value
/// (a diverged loss) is `nan`/`inf` in CSV and `null` in JSONL, which stays valid JSON.
struct MetricRow {
  std::string kind;                          ///< "train" (every N steps), "val" (a mid-epoch validation), "epoch" (end of an epoch) or "test"
  int64_t step = 0;                          ///< optimizer steps taken so far
  int64_t epoch = 0;                         ///< epoch the row belongs to
  std::optional<double> loss;                ///< training loss, the mean over the interval or the epoch
  std::optional<double> lr;                  ///< learning rate of param group 0
  std::optional<double> samples_per_second;  ///< training throughput over the interval
  std::optional<double> val_loss;            ///< validation loss, or test loss in a "test" row
  /// Validation metrics by name ("accuracy", "mse", ...), or the test metrics in a "test" row; each is
  /// written to the column "val_<name>".
  std::vector<std::pair<std::string, double>> val_metrics;
  /// Monitors by name ("lr_group_1", "momentum_group_0", "grad_norm", ...): every one goes to the JSONL
  /// row, and those the writer has a column for (see MetricsWriter) to the CSV row.
  std::vector<std::pair<std::string, double>> monitors;
};

/// Appends MetricRows to `DIR/metrics.csv` and `DIR/metrics.jsonl`, flushing each row so that a
/// killed run keeps every row written before it died. The CSV columns are
/// `kind,step,epoch,loss,lr,samples_per_second,val_loss`, one `val_<name>` per metric of the run, then one
/// per monitor column.
class MetricsWriter {
 public:
  /// Opens (appending, when `append`) both files in `dir`; writes the CSV header to a new file.
  /// `val_metrics` names the metric columns, `monitor_columns` the monitor columns (e.g. from
  /// train::MetricsLogger::monitor_columns). Appending to a CSV whose header differs throws
  /// std::runtime_error naming the file (the file is left as it was).
  MetricsWriter(const std::string& dir, bool append, std::vector<std::string> val_metrics = {"accuracy"},
                std::vector<std::string> monitor_columns = {});
  /// Writes one row to both files. Throws std::invalid_argument for a metric without a column and
  /// std::runtime_error naming the file when a write fails (a full disk). Appending first cuts a partial
  /// last line (left by a killed run) back to the last complete row.
  void write(const MetricRow& row);
  /// Also passes every row written from now on to `sink` (after the files; e.g. an experiment tracker).
  void add_sink(std::function<void(const MetricRow&)> sink);
  /// The CSV header line (without newline).
  std::string header() const;

 private:
  std::vector<std::string> val_metrics_;
  std::vector<std::string> monitor_columns_;
  std::string csv_path_;
  std::string jsonl_path_;
  std::ofstream csv_;
  std::ofstream jsonl_;
  std::vector<std::function<void(const MetricRow&)>> sinks_;
};

}  // namespace trainkit::log

namespace trainkit::log {

/// Draws `DIR/metrics.csv` (as MetricsWriter writes it) into one SVG with stacked plots against the step:
/// training and validation loss, the validation metrics (every `val_<name>` column; omitted when there
/// are none), and the learning rate.
/// Throws std::runtime_error naming the file when it cannot be read or written.
void write_curves_svg(const std::string& metrics_csv, const std::string& svg_path, const std::string& title);

}  // namespace trainkit::log
