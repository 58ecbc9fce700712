#pragma once
/// @file
/// The seam between checkpoints (train::CheckpointManager, which knows no process group) and a
/// dist::ProcessGroup: the ranks' numbers exchanged by all-gathers over the group's CPU backend (Gloo).
///
///     auto manager = std::make_shared<trainkit::train::CheckpointManager>("run/checkpoints", 3);
///     manager->set_sharded(trainkit::dist::checkpoint_group(pg));  // every rank saves its shard; rank 0 commits

#include <memory>

#include "trainkit/dist/process_group.h"
#include "trainkit/train/checkpoint.h"

namespace trainkit::dist {

/// `group`'s rank and world size, and an all-gather of int64 vectors of any length (two all-reduces of CPU
/// tensors: the lengths, then the values padded to the longest). A null group is a single process.
train::CheckpointGroup checkpoint_group(std::shared_ptr<ProcessGroup> group);

}  // namespace trainkit::dist
