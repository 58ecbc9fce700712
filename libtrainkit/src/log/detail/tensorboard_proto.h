#pragma once
// TensorBoard's Event and Summary messages, serialized with proto_wire. Internal to trainkit::log.
//
// A Summary.Value is built in two parts: a "value body" (everything but the tag: simple_value, image,
// histo, tensor, metadata) from one of the *_value functions, and the tag, added by encode_summary.

#include <cstdint>
#include <string>

#include "trainkit/log/summary_writer.h"

namespace trainkit::log::detail {

/// Event{wall_time, file_version: "brain.Event:2"}, the first record of every event file.
std::string file_version_event(double wall_time);
/// Event{wall_time, step, summary} with `summary` a serialized Summary; step 0 is left out, as proto3 does.
std::string encode_event(double wall_time, int64_t step, const std::string& summary);
/// Summary{value{tag, <value_body>}}: a Summary with one Value.
std::string encode_summary(const std::string& tag, const std::string& value_body);

/// Value body of a scalar: simple_value.
std::string scalar_value(float value);
/// Value body of text, as PyTorch's add_text: TensorProto{DT_STRING, shape [1], string_val [text]} and
/// the "text" plugin's metadata.
std::string text_value(const std::string& text);
/// Value body of a HistogramProto.
std::string histogram_value(const Histogram& histogram);
/// Value body of Summary.Image{height, width, colorspace (the channel count), encoded_image_string: png}.
std::string image_value(const Image& image, const std::string& png);
/// Value body holding only SummaryMetadata{plugin_data{plugin_name, content}} (content left out when
/// empty, as proto3 does).
std::string plugin_value(const std::string& plugin_name, const std::string& content);

}  // namespace trainkit::log::detail
