#pragma once
// The hparams-plugin summaries of SummaryWriter::add_hparams, as torch.utils.tensorboard.summary.hparams
// builds them. Internal to trainkit::log.

#include <string>
#include <utility>
#include <vector>

#include "trainkit/log/summary_writer.h"

namespace trainkit::log::detail {

/// The three hparams summaries, each a serialized `Summary` with one Value: tag `_hparams_/experiment`,
/// `_hparams_/session_start_info` or `_hparams_/session_end_info`, metadata plugin "hparams" with a
/// serialized HParamsPluginData.
struct HParamsSummaries {
  std::string experiment;
  std::string session_start_info;
  std::string session_end_info;
};

/// Experiment lists every hparam (type FLOAT64, STRING or BOOL) and every metric tag in the given order;
/// SessionStartInfo's map is written sorted by key (protobuf's deterministic order); SessionEndInfo has
/// status SUCCESS. Unlike PyTorch, whose `isinstance(v, int)` also catches bools, a bool is written as a
/// bool (bool_value, DATA_TYPE_BOOL), which TensorBoard shows as true/false.
/// Throws std::invalid_argument for an empty or repeated name.
HParamsSummaries make_hparams_summaries(const std::vector<std::pair<std::string, HParamValue>>& hparams,
                                        const std::vector<std::pair<std::string, double>>& metrics);

}  // namespace trainkit::log::detail
