#pragma once

// What a caching allocator's memory looks like: its segments and the blocks in them. The model of
// PyTorch's allocator (caching_allocator.h) describes itself so, the events carry it to the window's
// segment view, and memory snapshots are written from it.

#include <cstdint>
#include <vector>

namespace batchpilot::core {

/// One block of a segment, for the segment view and memory snapshots.
struct BlockView {
    int64_t offset = 0;  ///< from the segment's start
    int64_t bytes = 0;
    int64_t requestedBytes = 0;  ///< 0 for a free (cached) block
    bool allocated = false;
    bool mapped = true;  ///< false: an expandable segment's pages that are not mapped (not reserved)

    bool operator==(const BlockView&) const = default;
};

struct SegmentView {
    int64_t address = 0;  ///< a made-up device address, unique per segment
    int64_t bytes = 0;    ///< reserved (mapped, for an expandable segment)
    bool smallPool = false;
    bool expandable = false;
    std::vector<BlockView> blocks;

    /// Bytes in its allocated blocks.
    int64_t allocatedBytes() const {
        int64_t total = 0;
        for (const BlockView& block : blocks)
            if (block.allocated) total += block.bytes;
        return total;
    }

    bool operator==(const SegmentView&) const = default;
};

}  // namespace batchpilot::core
