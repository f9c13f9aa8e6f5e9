#pragma once

// PyTorch's CUDA caching allocator, modelled without a GPU: which segments a sequence of
// allocations and frees reserves, where each block sits in them, and when an allocation fails.
// The virtual GPU hands out host memory through it, so that reserved differs from allocated,
// freed blocks stay cached, segments fragment and an OOM is preceded by a flush and a retry, as
// on a real GPU. The rules and constants are those of c10/cuda/CUDACachingAllocator.cpp (one
// stream, no graphs): see docs/guide/virtual-gpu.md for each rule and its source.

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tl/expected.hpp>

#include "core/memory/segment_view.h"

namespace batchpilot::core {

/// The allocator's settings, in PyTorch's own syntax (PYTORCH_CUDA_ALLOC_CONF /
/// PYTORCH_ALLOC_CONF): "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:4".
/// "exact" is BatchPilot's own: every byte asked for is counted, nothing rounded or cached.
struct AllocatorSettings {
    bool exact = false;
    bool expandableSegments = false;
    int64_t maxSplitBytes = std::numeric_limits<int64_t>::max();  ///< max_split_size_mb (none: unlimited)
    int roundupPower2Divisions = 0;                               ///< 0 or 1: off

    bool operator==(const AllocatorSettings&) const = default;

    /// The settings as they are written ("" for the defaults), parseable by parseAllocatorSettings.
    std::string text() const;
};

/// Parses settings in PyTorch's syntax (comma-separated key:value; keys as PyTorch spells them,
/// values True/False or whole numbers) on top of `base`. PyTorch options this model does not
/// simulate (garbage_collection_threshold, backend, …) are named in `ignored`; unknown keys and
/// bad values are errors that say what was wrong. `separator` splits the settings (',' in the
/// environment variable, '/' in a device name, where ',' separates devices).
tl::expected<AllocatorSettings, std::string> parseAllocatorSettings(std::string_view text, AllocatorSettings base = {},
                                                                    char separator = ',',
                                                                    std::vector<std::string>* ignored = nullptr);

/// Why an allocation failed.
struct AllocationFailure {
    int64_t requestedBytes = 0;  ///< what the tensor asked for
    int64_t blockBytes = 0;      ///< rounded to the allocator's block size
    int64_t segmentBytes = 0;    ///< the new segment (or pages) it tried to reserve: CUDA's "Tried to allocate"
    int64_t allocatedBytes = 0;  ///< in blocks handed out, at the failure
    int64_t reservedBytes = 0;   ///< in segments, at the failure (after the flush)
    int64_t limitBytes = 0;
    int64_t largestFreeBlock = 0;  ///< the largest cached block of the request's pool
    /// Enough memory was free (limit − reserved + cached) but no block or segment could hold the
    /// request in one piece.
    bool fragmentation = false;
};

/// The allocator's counters, as torch.cuda.memory_stats() names them.
struct AllocatorStats {
    int64_t allocatedBytes = 0;  ///< allocated_bytes.all.current (block sizes)
    int64_t reservedBytes = 0;   ///< reserved_bytes.all.current (segments)
    int64_t requestedBytes = 0;  ///< requested_bytes.all.current (what tensors asked for)
    int64_t peakAllocatedBytes = 0;
    int64_t peakReservedBytes = 0;
    int64_t segments = 0;
    int64_t allocRetries = 0;  ///< num_alloc_retries: the cache was flushed to retry an allocation
    int64_t ooms = 0;          ///< num_ooms
};

/// The model. Not thread-safe: its owner serialises calls.
class CachingAllocatorModel {
public:
    // c10/cuda/CUDACachingAllocator.cpp
    static constexpr int64_t kMinBlockSize = 512;             ///< every block is a multiple of it
    static constexpr int64_t kSmallSize = 1 << 20;            ///< largest "small" request
    static constexpr int64_t kSmallBuffer = 2 << 20;          ///< small pool's segment size
    static constexpr int64_t kLargeBuffer = 20 << 20;         ///< segment for requests of 1–10 MiB
    static constexpr int64_t kMinLargeAlloc = 10 << 20;       ///< from here, segments are the request's size
    static constexpr int64_t kRoundLarge = 2 << 20;           ///< … rounded up to this
    static constexpr int64_t kExpandablePageSmall = 2 << 20;  ///< expandable segments map these pages
    static constexpr int64_t kExpandablePageLarge = 20 << 20;

    explicit CachingAllocatorModel(AllocatorSettings settings = {}, int64_t limitBytes = 0);

    /// Allocates a block for `bytes`; its address, or the failure (then nothing changed except
    /// the flushed cache and the counters).
    tl::expected<int64_t, AllocationFailure> allocate(int64_t bytes);
    /// Frees the block at `address` (it stays cached).
    void free(int64_t address);
    /// torch.cuda.empty_cache(): returns every cached segment that holds no allocated block (and
    /// an expandable segment's free pages).
    void emptyCache();

    const AllocatorStats& stats() const { return m_stats; }
    int64_t limit() const { return m_limit; }
    void setLimit(int64_t bytes) { m_limit = bytes; }
    const AllocatorSettings& settings() const { return m_settings; }
    /// Bytes reserved but not in allocated blocks: the cache.
    int64_t cachedBytes() const { return m_stats.reservedBytes - m_stats.allocatedBytes; }

    /// Every segment with its blocks, in address order.
    std::vector<SegmentView> segments() const;

    /// The block size a request of `bytes` gets (round_size).
    int64_t roundSize(int64_t bytes) const;
    /// The segment a new block of `blockBytes` reserves (get_allocation_size).
    static int64_t segmentSizeFor(int64_t blockBytes);

private:
    struct Block {
        int64_t address = 0;
        int64_t bytes = 0;
        int64_t requested = 0;
        int64_t segment = 0;  ///< the segment's address
        bool allocated = false;
        bool small = false;
    };
    struct Segment {
        int64_t bytes = 0;  ///< reserved (mapped pages for an expandable one)
        int64_t span = 0;   ///< address range (an expandable segment's grows)
        bool small = false;
        bool expandable = false;
        std::vector<bool> mappedPages;  ///< expandable only
    };
    using FreeSet = std::set<std::pair<int64_t, int64_t>>;  // (bytes, address)

    FreeSet& pool(bool small) { return small ? m_smallFree : m_largeFree; }
    std::optional<int64_t> bestFreeBlock(int64_t size, bool small) const;
    std::optional<int64_t> newSegment(int64_t segmentBytes, bool small, bool retry);
    bool shouldSplit(const Block& block, int64_t size) const;
    int64_t takeBlock(int64_t address, int64_t size, int64_t requested);
    void releaseSegment(int64_t segmentAddress);
    bool releaseOversizeBlocks(int64_t size, bool small);
    void releaseCachedSegments();
    void addReserved(int64_t bytes);
    void addAllocated(int64_t bytes, int64_t requested);
    std::map<int64_t, Block>::iterator blockAt(int64_t address);
    // Expandable segments: one per pool, growing; pages mapped as blocks need them.
    int64_t pageBytes(bool small) const { return small ? kExpandablePageSmall : kExpandablePageLarge; }
    tl::expected<int64_t, int64_t> allocateExpandable(int64_t size, int64_t requested, bool small);
    int64_t pagesToMap(const Segment& segment, int64_t begin, int64_t end, bool small) const;
    void mapPages(Segment& segment, int64_t begin, int64_t end, bool small);
    void unmapFreePages();

    AllocatorSettings m_settings;
    int64_t m_limit = 0;
    AllocatorStats m_stats;
    std::map<int64_t, Block> m_blocks;      // by address
    std::map<int64_t, Segment> m_segments;  // by address
    FreeSet m_smallFree;
    FreeSet m_largeFree;
    int64_t m_nextAddress = int64_t{1} << 40;
    std::map<int64_t, int64_t> m_exactBlocks;  // exact mode: address → bytes
};

/// CUDA's out-of-memory text for a failure, with the model's numbers ("CUDA out of memory. Tried to
/// allocate 20.00 MiB. GPU 0 has a total capacity of …"), as PyTorch 2.x writes it.
std::string cudaOutOfMemoryText(const AllocationFailure& failure, int device = 0);
/// PyTorch's format_size: "512 bytes", "1.50 KiB", "20.00 MiB", "14.75 GiB".
std::string formatSizeAsPyTorch(int64_t bytes);

/// The numbers of a CUDA out-of-memory message read back (from PyTorch's text, real or modelled);
/// empty when the text is not one.
struct CudaOomNumbers {
    int64_t triedBytes = 0;
    int64_t totalBytes = 0;
    int64_t freeBytes = 0;
    int64_t allocatedBytes = 0;
    int64_t reservedUnallocatedBytes = 0;
    /// The process's limit where the allocator was capped (torch.cuda.set_per_process_memory_fraction,
    /// --cuda-memory-fraction: "… 8.00 GiB allowed;"); 0 without a cap.
    int64_t allowedBytes = 0;
    /// What the allocator could still reserve: the GPU's free memory, or less under a cap.
    int64_t reservableBytes() const;
};
std::optional<CudaOomNumbers> parseCudaOutOfMemoryText(std::string_view text);

/// What an OOM's numbers say, in words with the remedy: "fragmentation: …" when the reservable and
/// the cached-but-unallocated memory together held what was tried (no block was large enough), else
/// "exhaustion: …". Under a cap the GPU's free memory is not reservable: a real H200 capped to
/// 8 GiB had 138 GiB free at every OOM.
/// `expandableSegments`: the allocator already runs with it, so the remedy named is the size.
std::string describeCudaOom(const CudaOomNumbers& numbers, bool expandableSegments = false);

}  // namespace batchpilot::core
