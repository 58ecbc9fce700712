#include "log/detail/hparams.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>

#include "log/detail/proto_wire.h"
#include "log/detail/tensorboard_proto.h"

namespace trainkit::log::detail {
namespace {

// Field numbers of tensorboard/plugins/hparams/{plugin_data,api}.proto and google/protobuf/struct.proto.
namespace field {
constexpr uint32_t kHpPluginDataExperiment = 2, kHpPluginDataSessionStart = 3, kHpPluginDataSessionEnd = 4;
constexpr uint32_t kSessionStartHparams = 1, kMapKey = 1, kMapValue = 2;
constexpr uint32_t kStructNumber = 2, kStructString = 3, kStructBool = 4;
constexpr uint32_t kExperimentHparamInfos = 4, kExperimentMetricInfos = 5;
constexpr uint32_t kHparamInfoName = 1, kHparamInfoType = 4;
constexpr uint32_t kMetricInfoName = 1, kMetricNameTag = 2;
constexpr uint32_t kSessionEndStatus = 1;
}  // namespace field
// hparams api.proto enums.
constexpr uint64_t kHpTypeString = 1, kHpTypeBool = 2, kHpTypeFloat64 = 3, kHpStatusSuccess = 1;

}  // namespace

HParamsSummaries make_hparams_summaries(const std::vector<std::pair<std::string, HParamValue>>& hparams,
                                        const std::vector<std::pair<std::string, double>>& metrics) {
  const auto check_names = [](const auto& items, const char* what) {
    std::vector<std::string> names;
    for (const auto& item : items) {
      if (item.first.empty()) {
        throw std::invalid_argument(fmt::format("add_hparams: an empty {} name", what));
      }
      names.push_back(item.first);
    }
    std::sort(names.begin(), names.end());
    const auto dup = std::adjacent_find(names.begin(), names.end());
    if (dup != names.end()) {
      throw std::invalid_argument(fmt::format("add_hparams: the {} \"{}\" is given twice", what, *dup));
    }
  };
  check_names(hparams, "hparam");
  check_names(metrics, "metric");

  // HParamsPluginData{version: 0 (left out), <oneof field>: message} as the plugin content.
  const auto summary = [](const std::string& tag, uint32_t oneof_field, const std::string& message) {
    std::string content;
    put_bytes_field(content, oneof_field, message);
    return encode_summary(tag, plugin_value("hparams", content));
  };

  // SessionStartInfo.hparams: map<string, google.protobuf.Value>, entries sorted by key.
  std::vector<std::pair<std::string, HParamValue>> sorted = hparams;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string start;
  for (const auto& [name, value] : sorted) {
    std::string v;
    switch (value.kind()) {
      case HParamValue::Kind::kNumber: put_double_field(v, field::kStructNumber, value.number()); break;
      case HParamValue::Kind::kString: put_bytes_field(v, field::kStructString, value.string()); break;
      case HParamValue::Kind::kBool: put_varint_field(v, field::kStructBool, value.boolean() ? 1 : 0); break;
    }
    std::string entry;
    put_bytes_field(entry, field::kMapKey, name);
    put_bytes_field(entry, field::kMapValue, v);
    put_bytes_field(start, field::kSessionStartHparams, entry);
  }

  std::string experiment;
  for (const auto& [name, value] : hparams) {
    std::string info;
    put_bytes_field(info, field::kHparamInfoName, name);
    const uint64_t type = value.kind() == HParamValue::Kind::kNumber   ? kHpTypeFloat64
                          : value.kind() == HParamValue::Kind::kString ? kHpTypeString
                                                                       : kHpTypeBool;
    put_varint_field(info, field::kHparamInfoType, type);
    put_bytes_field(experiment, field::kExperimentHparamInfos, info);
  }
  for (const auto& [name, value] : metrics) {
    std::string metric_name;
    put_bytes_field(metric_name, field::kMetricNameTag, name);
    std::string info;
    put_bytes_field(info, field::kMetricInfoName, metric_name);
    put_bytes_field(experiment, field::kExperimentMetricInfos, info);
  }

  std::string end;
  put_varint_field(end, field::kSessionEndStatus, kHpStatusSuccess);

  HParamsSummaries out;
  out.experiment = summary("_hparams_/experiment", field::kHpPluginDataExperiment, experiment);
  out.session_start_info = summary("_hparams_/session_start_info", field::kHpPluginDataSessionStart, start);
  out.session_end_info = summary("_hparams_/session_end_info", field::kHpPluginDataSessionEnd, end);
  return out;
}

}  // namespace trainkit::log::detail
