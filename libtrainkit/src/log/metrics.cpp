#include "trainkit/log/metrics.h"

#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

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
