#include "log/detail/tensorboard_proto.h"

#include "log/detail/proto_wire.h"

namespace trainkit::log::detail {
namespace {

// Field numbers, checked against tensorboard/compat/proto/{event,summary,histogram,tensor,tensor_shape}.proto.
namespace field {
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2, kValueImage = 4, kValueHisto = 5, kValueTensor = 8,
                   kValueMetadata = 9;
constexpr uint32_t kImageHeight = 1, kImageWidth = 2, kImageColorspace = 3, kImageEncoded = 4;
constexpr uint32_t kHistoMin = 1, kHistoMax = 2, kHistoNum = 3, kHistoSum = 4, kHistoSumSquares = 5,
                   kHistoBucketLimit = 6, kHistoBucket = 7;
constexpr uint32_t kMetadataPluginData = 1, kPluginName = 1, kPluginContent = 2;
constexpr uint32_t kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8;
constexpr uint32_t kShapeDim = 2, kDimSize = 1;
}  // namespace field
constexpr uint64_t kDtString = 7;  // tensorboard.DataType.DT_STRING

}  // namespace

std::string file_version_event(double wall_time) {
  std::string event;
  put_double_field(event, field::kEventWallTime, wall_time);
  put_bytes_field(event, field::kEventFileVersion, "brain.Event:2");
  return event;
}

std::string encode_event(double wall_time, int64_t step, const std::string& summary) {
  std::string event;
  put_double_field(event, field::kEventWallTime, wall_time);
  if (step != 0) {
    put_varint_field(event, field::kEventStep, static_cast<uint64_t>(step));
  }
  put_bytes_field(event, field::kEventSummary, summary);
  return event;
}

std::string encode_summary(const std::string& tag, const std::string& value_body) {
  std::string value;
  put_bytes_field(value, field::kValueTag, tag);
  value += value_body;
  std::string summary;
  put_bytes_field(summary, field::kSummaryValue, value);
  return summary;
}

std::string scalar_value(float value) {
  std::string body;
  put_float_field(body, field::kValueSimpleValue, value);
  return body;
}

std::string text_value(const std::string& text) {
  std::string dim;
  put_varint_field(dim, field::kDimSize, 1);
  std::string shape;
  put_bytes_field(shape, field::kShapeDim, dim);
  std::string tensor;
  put_varint_field(tensor, field::kTensorDtype, kDtString);
  put_bytes_field(tensor, field::kTensorShape, shape);
  put_bytes_field(tensor, field::kTensorStringVal, text);

  std::string body;
  put_bytes_field(body, field::kValueTensor, tensor);
  // TextPluginData{version: 0} serializes to nothing.
  body += plugin_value("text", "");
  return body;
}

std::string histogram_value(const Histogram& histogram) {
  std::string h;
  put_double_field(h, field::kHistoMin, histogram.min);
  put_double_field(h, field::kHistoMax, histogram.max);
  put_double_field(h, field::kHistoNum, histogram.num);
  put_double_field(h, field::kHistoSum, histogram.sum);
  put_double_field(h, field::kHistoSumSquares, histogram.sum_squares);
  put_packed_doubles(h, field::kHistoBucketLimit, histogram.bucket_limit);
  put_packed_doubles(h, field::kHistoBucket, histogram.bucket);
  std::string body;
  put_bytes_field(body, field::kValueHisto, h);
  return body;
}

std::string image_value(const Image& image, const std::string& png) {
  std::string encoded;
  put_varint_field(encoded, field::kImageHeight, static_cast<uint64_t>(image.height));
  put_varint_field(encoded, field::kImageWidth, static_cast<uint64_t>(image.width));
  put_varint_field(encoded, field::kImageColorspace, static_cast<uint64_t>(image.channels));
  put_bytes_field(encoded, field::kImageEncoded, png);
  std::string body;
  put_bytes_field(body, field::kValueImage, encoded);
  return body;
}

std::string plugin_value(const std::string& plugin_name, const std::string& content) {
  std::string plugin_data;
  put_bytes_field(plugin_data, field::kPluginName, plugin_name);
  if (!content.empty()) {
    put_bytes_field(plugin_data, field::kPluginContent, content);
  }
  std::string metadata;
  put_bytes_field(metadata, field::kMetadataPluginData, plugin_data);
  std::string body;
  put_bytes_field(body, field::kValueMetadata, metadata);
  return body;
}

}  // namespace trainkit::log::detail
