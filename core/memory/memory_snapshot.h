#pragma once

// PyTorch's memory snapshot of the allocator's segments: the dictionary
// torch.cuda.memory._snapshot() returns and torch.cuda.memory._dump_snapshot() pickles, which
// https://pytorch.org/memory_viz and `python -m torch.cuda._memory_viz` open. Written from the
// virtual GPU's model of the caching allocator, so that its segments can be looked at with
// PyTorch's own tools.

#include <string>
#include <vector>

#include "core/memory/caching_allocator.h"

namespace batchpilot::core {

/// The snapshot as a pickle (protocol 2): {"segments": [{"device", "address", "total_size",
/// "allocated_size", "active_size", "requested_size", "stream", "segment_type", "is_expandable",
/// "frames", "blocks": [{"address", "size", "requested_size", "state", "frames"}]}],
/// "device_traces": [[]]}. A block's state is "active_allocated" or "inactive" (cached); an
/// expandable segment lists its allocated blocks and its mapped free bytes as one cached block
/// after them (it maps pages, not blocks). No stack frames
/// or allocation trace: the model does not record them.
std::string memorySnapshotPickle(const std::vector<SegmentView>& segments);

/// The most memory snapshots a run writes at OOMs, per rank (OomEvent::snapshotFile): the first
/// ones show how it ran out, and a run that recovers from thousands of OOMs does not fill the disk
/// (a snapshot is a few hundred bytes per segment).
constexpr int kMaxOomSnapshots = 16;

}  // namespace batchpilot::core
