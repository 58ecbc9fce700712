#include "trainkit/dist/checkpoint_group.h"

#include <algorithm>

#include <ATen/ATen.h>

namespace trainkit::dist {

train::CheckpointGroup checkpoint_group(std::shared_ptr<ProcessGroup> group) {
  train::CheckpointGroup out;
  if (group == nullptr) {
    return out;
  }
  out.rank = group->rank();
  out.world_size = group->world_size();
  out.all_gather = [group](const std::vector<int64_t>& values) {
    const int64_t world = group->world_size();
    const int64_t rank = group->rank();
    // Each rank fills its own row of zeros; a sum over the ranks is then the gather.
    at::Tensor lengths = at::zeros({world}, at::kLong);
    lengths[rank] = static_cast<int64_t>(values.size());
    group->all_reduce(lengths).wait();
    const auto* length = lengths.data_ptr<int64_t>();
    const int64_t longest = std::max<int64_t>(1, *std::max_element(length, length + world));
    at::Tensor rows = at::zeros({world, longest}, at::kLong);
    std::copy(values.begin(), values.end(), rows[rank].data_ptr<int64_t>());
    group->all_reduce(rows).wait();
    std::vector<std::vector<int64_t>> out_rows;
    for (int64_t r = 0; r < world; ++r) {
      const int64_t* row = rows[r].data_ptr<int64_t>();
      out_rows.emplace_back(row, row + length[r]);
    }
    return out_rows;
  };
  return out;
}

}  // namespace trainkit::dist
