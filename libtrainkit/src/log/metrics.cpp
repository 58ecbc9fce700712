#include "trainkit/log/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <vector>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "trainkit/log/svg_plot.h"

namespace trainkit::log {
namespace {

constexpr const char* kColumns = "kind,step,epoch,loss,lr,samples_per_second,val_loss";

std::string csv_field(const std::optional<double>& v) { return v ? fmt::format("{:.9g}", *v) : ""; }

// JSON Lines: a non-finite value is written as null (JSON has no NaN or Infinity), a finite one in its
// shortest round-trip form; names are escaped.
void json_field(nlohmann::ordered_json& row, const std::string& name, const std::optional<double>& v) {
  if (v) {
    row[name] = *v;
  }
}

// A run killed (or out of disk space) in the middle of a row leaves a partial last line: appending after it
// would glue the next row to it, so a file to append to is cut back to its last complete line.
void drop_partial_last_line(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size == 0) {
    return;
  }
  // Only the tail is read: a long run's metrics file can be large, and it usually ends with a newline.
  std::ifstream in(path, std::ios::binary);
  uintmax_t end = size;
  uintmax_t keep = 0;
  bool complete = false;
  std::string block;
  while (end > 0) {
    const uintmax_t begin = end > 4096 ? end - 4096 : 0;
    block.resize(static_cast<size_t>(end - begin));
    in.seekg(static_cast<std::streamoff>(begin));
    if (!in.read(block.data(), static_cast<std::streamsize>(block.size()))) {
      return;  // unreadable: the append that follows reports the file
    }
    if (end == size && block.back() == '\n') {
      complete = true;
      break;
    }
    const size_t nl = block.rfind('\n');
    if (nl != std::string::npos) {
      keep = begin + nl + 1;
      break;
    }
    end = begin;
  }
  if (complete) {
    return;
  }
  spdlog::warn("{}: dropping a partial last row ({} bytes) before appending", path.string(), size - keep);
  std::filesystem::resize_file(path, keep);
}

std::ofstream open_for_append(const std::filesystem::path& path, bool append) {
  if (append) {
    drop_partial_last_line(path);
  }
  std::ofstream f(path, append ? std::ios::app : std::ios::trunc);
  if (!f) {
    throw std::runtime_error(fmt::format("{}: cannot open for writing", path.string()));
  }
  return f;
}

// A row the stream could not write (a full disk): an error naming the file, not a silently lost row.
void check_written(std::ofstream& stream, const std::string& path) {
  if (!stream) {
    const int err = errno;
    throw std::runtime_error(fmt::format("{}: write failed: {}", path, err != 0 ? std::strerror(err) : "stream error"));
  }
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& dir, bool append, std::vector<std::string> val_metrics,
                             std::vector<std::string> monitor_columns)
    : val_metrics_(std::move(val_metrics)), monitor_columns_(std::move(monitor_columns)) {
  const std::filesystem::path csv_path = std::filesystem::path(dir) / "metrics.csv";
  csv_path_ = csv_path.string();
  jsonl_path_ = (std::filesystem::path(dir) / "metrics.jsonl").string();
  const bool new_csv = !append || !std::filesystem::exists(csv_path) || std::filesystem::file_size(csv_path) == 0;
  if (!new_csv) {
    std::ifstream existing(csv_path);
    std::string first;
    std::getline(existing, first);
    if (first != header()) {
      throw std::runtime_error(fmt::format("{}: has columns \"{}\" but this run writes \"{}\" (a run with other "
                                           "metrics cannot append to it)",
                                           csv_path.string(), first, header()));
    }
  }
  csv_ = open_for_append(csv_path, append);
  jsonl_ = open_for_append(jsonl_path_, append);
  if (new_csv) {
    csv_ << header() << '\n';
  }
}

std::string MetricsWriter::header() const {
  std::string h = kColumns;
  for (const auto& name : val_metrics_) {
    h += ",val_" + name;
  }
  for (const auto& name : monitor_columns_) {
    h += "," + name;
  }
  return h;
}

void MetricsWriter::write(const MetricRow& row) {
  std::vector<std::optional<double>> values(val_metrics_.size());
  for (const auto& [name, value] : row.val_metrics) {
    const auto it = std::find(val_metrics_.begin(), val_metrics_.end(), name);
    if (it == val_metrics_.end()) {
      throw std::invalid_argument(fmt::format("MetricsWriter: metric \"{}\" has no column (columns: {})", name,
                                              header()));
    }
    values[static_cast<size_t>(it - val_metrics_.begin())] = value;
  }
  std::string line = fmt::format("{},{},{},{},{},{},{}", row.kind, row.step, row.epoch, csv_field(row.loss),
                                 csv_field(row.lr), csv_field(row.samples_per_second), csv_field(row.val_loss));
  for (const auto& v : values) {
    line += ',';
    line += csv_field(v);
  }
  for (const auto& column : monitor_columns_) {
    std::optional<double> v;
    for (const auto& [name, value] : row.monitors) {
      if (name == column) {
        v = value;
      }
    }
    line += ',';
    line += csv_field(v);
  }
  csv_ << line << '\n';
  csv_.flush();
  check_written(csv_, csv_path_);
  nlohmann::ordered_json json = {{"kind", row.kind}, {"step", row.step}, {"epoch", row.epoch}};
  json_field(json, "loss", row.loss);
  json_field(json, "lr", row.lr);
  json_field(json, "samples_per_second", row.samples_per_second);
  json_field(json, "val_loss", row.val_loss);
  for (size_t i = 0; i < values.size(); ++i) {
    json_field(json, "val_" + val_metrics_[i], values[i]);
  }
  for (const auto& [name, value] : row.monitors) {
    json_field(json, name, value);
  }
  jsonl_ << json.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  jsonl_.flush();
  check_written(jsonl_, jsonl_path_);
  for (const auto& sink : sinks_) {
    sink(row);
  }
}

void MetricsWriter::add_sink(std::function<void(const MetricRow&)> sink) { sinks_.push_back(std::move(sink)); }

}  // namespace trainkit::log

namespace trainkit::log {
namespace {

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string field;
  while (std::getline(ss, field, ',')) {
    out.push_back(field);
  }
  if (!line.empty() && line.back() == ',') {
    out.emplace_back();
  }
  return out;
}

}  // namespace

void write_curves_svg(const std::string& metrics_csv, const std::string& svg_path, const std::string& title) {
  std::ifstream in(metrics_csv);
  if (!in) {
    throw std::runtime_error(fmt::format("{}: cannot read", metrics_csv));
  }
  struct Xy {
    std::vector<double> x, y;
    void add(double a, const std::string& b) {
      if (!b.empty()) {
        x.push_back(a);
        y.push_back(std::stod(b));
      }
    }
  };
  Xy train_loss, epoch_loss, val_loss, lr;
  std::string line;
  std::getline(in, line);
  const auto columns = split_csv(line);
  if (columns.size() < 7 || columns[6] != "val_loss") {
    throw std::runtime_error(fmt::format("{}: not a trainkit metrics file (header \"{}\")", metrics_csv, line));
  }
  std::vector<std::pair<std::string, Xy>> metrics;  // the val_<name> columns after val_loss
  for (size_t c = 7; c < columns.size(); ++c) {
    metrics.emplace_back(columns[c].substr(columns[c].rfind("val_", 0) == 0 ? 4 : 0), Xy{});
  }
  while (std::getline(in, line)) {
    const auto f = split_csv(line);
    if (f.size() < columns.size()) {
      continue;
    }
    const double step = std::stod(f[1]);
    if (f[0] == "train") {
      train_loss.add(step, f[3]);
      lr.add(step, f[4]);
    } else if (f[0] == "epoch" || f[0] == "val") {  // "val": a mid-epoch validation
      if (f[0] == "epoch") {
        epoch_loss.add(step, f[3]);
      }
      if (lr.x.empty() || lr.x.back() < step) {
        lr.add(step, f[4]);
      }
      val_loss.add(step, f[6]);
      for (size_t m = 0; m < metrics.size(); ++m) {
        metrics[m].second.add(step, f[7 + m]);
      }
    }
  }
  const auto panel = [&title](const std::string& what, const std::string& y_label, bool log_y) {
    return SvgPlot(
        PlotOptions().title(fmt::format("{}: {}", title, what)).x_label("step").y_label(y_label).log_y(log_y));
  };
  SvgPlot loss = panel("loss", "loss", false);
  loss.add_series({"train (interval mean)", train_loss.x, train_loss.y, false});
  loss.add_series({"train (epoch mean)", epoch_loss.x, epoch_loss.y, true});
  loss.add_series({"validation", val_loss.x, val_loss.y, true});
  SvgPlot rate = panel("learning rate", "learning rate (group 0)", false);
  rate.add_series({"lr", lr.x, lr.y, false});
  std::vector<const SvgPlot*> panels{&loss};
  std::optional<SvgPlot> metric_panel;
  if (!metrics.empty()) {
    metric_panel.emplace(panel("validation metrics", metrics.size() == 1 ? metrics.front().first : "value", false));
    for (const auto& [name, xy] : metrics) {
      metric_panel->add_series({"validation " + name, xy.x, xy.y, true});
    }
    panels.push_back(&*metric_panel);
  }
  panels.push_back(&rate);
  // Standalone plots stacked in one document (nested <svg> elements placed by their y attribute).
  const int height = PlotOptions().height();
  std::string doc = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\">\n",
      PlotOptions().width(), static_cast<int>(panels.size()) * height, PlotOptions().width(),
      static_cast<int>(panels.size()) * height);
  int y = 0;
  for (const SvgPlot* p : panels) {
    std::string part = p->render();
    part.insert(4, fmt::format(" y=\"{}\"", y));  // after "<svg"
    doc += part;
    y += height;
  }
  doc += "</svg>\n";
  std::ofstream out(svg_path);
  if (!out || !(out << doc)) {
    throw std::runtime_error(fmt::format("{}: cannot write", svg_path));
  }
}

}  // namespace trainkit::log
