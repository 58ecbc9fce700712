#include "trainkit/log/metrics.h"

#include <filesystem>
#include <sstream>
#include <vector>
#include <stdexcept>

#include <fmt/format.h>

#include "trainkit/log/svg_plot.h"

namespace trainkit::log {
namespace {

constexpr const char* kColumns = "kind,step,epoch,loss,lr,samples_per_second,val_loss,val_accuracy";

std::string csv_field(const std::optional<double>& v) { return v ? fmt::format("{:.9g}", *v) : ""; }

void json_field(std::string& out, const char* name, const std::optional<double>& v) {
  if (v) {
    out += fmt::format(",\"{}\":{:.9g}", name, *v);
  }
}

std::ofstream open_for_append(const std::filesystem::path& path, bool append) {
  std::ofstream f(path, append ? std::ios::app : std::ios::trunc);
  if (!f) {
    throw std::runtime_error(fmt::format("{}: cannot open for writing", path.string()));
  }
  return f;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& dir, bool append) {
  const std::filesystem::path csv_path = std::filesystem::path(dir) / "metrics.csv";
  const bool new_csv = !append || !std::filesystem::exists(csv_path) || std::filesystem::file_size(csv_path) == 0;
  csv_ = open_for_append(csv_path, append);
  jsonl_ = open_for_append(std::filesystem::path(dir) / "metrics.jsonl", append);
  if (new_csv) {
    csv_ << kColumns << '\n';
  }
}

void MetricsWriter::write(const MetricRow& row) {
  csv_ << fmt::format("{},{},{},{},{},{},{},{}\n", row.kind, row.step, row.epoch, csv_field(row.loss),
                      csv_field(row.lr), csv_field(row.samples_per_second), csv_field(row.val_loss),
                      csv_field(row.val_accuracy));
  csv_.flush();
  std::string json = fmt::format("{{\"kind\":\"{}\",\"step\":{},\"epoch\":{}", row.kind, row.step, row.epoch);
  json_field(json, "loss", row.loss);
  json_field(json, "lr", row.lr);
  json_field(json, "samples_per_second", row.samples_per_second);
  json_field(json, "val_loss", row.val_loss);
  json_field(json, "val_accuracy", row.val_accuracy);
  jsonl_ << json << "}\n";
  jsonl_.flush();
}

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
  Xy train_loss, epoch_loss, val_loss, val_acc, lr;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    const auto f = split_csv(line);
    if (f.size() < 8) {
      continue;
    }
    const double step = std::stod(f[1]);
    if (f[0] == "train") {
      train_loss.add(step, f[3]);
      lr.add(step, f[4]);
    } else if (f[0] == "epoch") {
      epoch_loss.add(step, f[3]);
      if (lr.x.empty() || lr.x.back() < step) {
        lr.add(step, f[4]);
      }
      val_loss.add(step, f[6]);
      val_acc.add(step, f[7]);
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
  SvgPlot acc = panel("validation accuracy", "accuracy", false);
  acc.add_series({"validation accuracy", val_acc.x, val_acc.y, true});
  SvgPlot rate = panel("learning rate", "learning rate (group 0)", false);
  rate.add_series({"lr", lr.x, lr.y, false});
  // Three standalone plots stacked in one document (nested <svg> elements placed by their y attribute).
  const int height = PlotOptions().height();
  std::string doc = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\">\n",
      PlotOptions().width(), 3 * height, PlotOptions().width(), 3 * height);
  int y = 0;
  for (const SvgPlot* p : {&loss, &acc, &rate}) {
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
