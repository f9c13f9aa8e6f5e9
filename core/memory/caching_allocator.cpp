#include "core/memory/caching_allocator.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cstdio>

#include "core/base/text_format.h"

namespace batchpilot::core {
namespace {

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kLargeBufferMb = CachingAllocatorModel::kLargeBuffer / kMiB;

std::string trimmed(std::string_view text) {
    const auto first = text.find_first_not_of(" \t");
    if (first == std::string_view::npos) return {};
    const auto last = text.find_last_not_of(" \t");
    return std::string(text.substr(first, last - first + 1));
}

std::optional<int64_t> wholeNumber(std::string_view text) {
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || end != text.data() + text.size() || value < 0) return std::nullopt;
    return value;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Settings

std::string AllocatorSettings::text() const {
    if (exact) return "exact";
    std::string out;
    const auto add = [&](const std::string& item) { out += (out.empty() ? "" : ",") + item; };
    if (expandableSegments) add("expandable_segments:True");
    if (maxSplitBytes != std::numeric_limits<int64_t>::max())
        add("max_split_size_mb:" + std::to_string(maxSplitBytes / kMiB));
    if (roundupPower2Divisions > 1) add("roundup_power2_divisions:" + std::to_string(roundupPower2Divisions));
    return out;
}

tl::expected<AllocatorSettings, std::string> parseAllocatorSettings(std::string_view text, AllocatorSettings base,
                                                                    char separator, std::vector<std::string>* ignored) {
    AllocatorSettings settings = base;
    // PyTorch's options that change nothing the model simulates (or only on a real GPU).
    static const std::vector<std::string> kNotModelled = {
        "garbage_collection_threshold",      "backend",
        "release_lock_on_cudamalloc",        "pinned_use_cuda_host_register",
        "pinned_num_register_threads",       "pinned_use_background_threads",
        "graph_capture_record_stream_reuse", "per_process_memory_fraction"};
    std::vector<std::string> given;  // the settings named, to refuse one named twice or a contradiction
    size_t start = 0;
    while (start <= text.size()) {
        size_t end = text.find(separator, start);
        if (end == std::string_view::npos) end = text.size();
        const std::string item = trimmed(text.substr(start, end - start));
        start = end + 1;
        if (item.empty()) continue;
        const std::string named = trimmed(std::string_view(item).substr(0, item.find(':')));
        if (std::find(given.begin(), given.end(), named) != given.end())
            return tl::unexpected("allocator setting " + cutForMessage(named) +
                                  " is given twice: keep the one you mean");
        given.push_back(named);
        const bool exact = std::find(given.begin(), given.end(), "exact") != given.end();
        if (exact && given.size() > 1) {
            const std::string& other = given.front() == "exact" ? given.back() : given.front();
            return tl::unexpected(
                "allocator setting exact counts bytes without PyTorch's caching allocator: it "
                "takes no other (\"" +
                cutForMessage(other) + "\"); keep exact, or drop it for the caching model");
        }
        if (item == "exact") {
            settings = AllocatorSettings{};
            settings.exact = true;
            continue;
        }
        if (item == "caching") {  // PyTorch's caching allocator with its defaults
            settings.exact = false;
            continue;
        }
        const auto colon = item.find(':');
        if (colon == std::string::npos) {
            return tl::unexpected(
                "allocator setting \"" + cutForMessage(item) +
                "\" needs a value: write key:value, e.g. expandable_segments:True, or caching or exact");
        }
        const std::string key = trimmed(std::string_view(item).substr(0, colon));
        const std::string value = trimmed(std::string_view(item).substr(colon + 1));
        if (key == "expandable_segments") {
            if (value != "True" && value != "False") {
                return tl::unexpected("allocator setting expandable_segments takes True or False, not \"" +
                                      cutForMessage(value) + "\"");
            }
            settings.expandableSegments = value == "True";
            settings.exact = false;
        } else if (key == "max_split_size_mb") {
            const auto mb = wholeNumber(value);
            // PyTorch: "CachingAllocator option max_split_size_mb too small, must be > 20".
            if (!mb || *mb <= kLargeBufferMb || *mb > (int64_t{1} << 40)) {
                return tl::unexpected("allocator setting max_split_size_mb must be a whole number of MiB above " +
                                      std::to_string(kLargeBufferMb) + ", not \"" + cutForMessage(value) + "\"");
            }
            settings.maxSplitBytes = *mb * kMiB;
            settings.exact = false;
        } else if (key == "roundup_power2_divisions") {
            const auto divisions = wholeNumber(value);
            if (!divisions || *divisions > 64 ||
                (*divisions > 0 && !std::has_single_bit(static_cast<uint64_t>(*divisions)))) {
                return tl::unexpected(
                    "allocator setting roundup_power2_divisions must be a power of two up to 64 (0 or 1: off), not \"" +
                    cutForMessage(value) + "\" (the per-range list form is not simulated)");
            }
            settings.roundupPower2Divisions = static_cast<int>(*divisions);
            settings.exact = false;
        } else if (std::find(kNotModelled.begin(), kNotModelled.end(), key) != kNotModelled.end()) {
            if (ignored != nullptr) ignored->push_back(key);
        } else {
            return tl::unexpected("unknown allocator setting \"" + cutForMessage(key) +
                                  "\": the virtual GPU simulates expandable_segments, max_split_size_mb and "
                                  "roundup_power2_divisions (PyTorch's names), caching and exact");
        }
    }
    return settings;
}

// ---------------------------------------------------------------------------------------------
// The model

CachingAllocatorModel::CachingAllocatorModel(AllocatorSettings settings, int64_t limitBytes)
    : m_settings(settings), m_limit(limitBytes) {}

int64_t CachingAllocatorModel::roundSize(int64_t bytes) const {
    if (m_settings.exact) return bytes;
    if (bytes < kMinBlockSize) return kMinBlockSize;
    const int divisions = m_settings.roundupPower2Divisions;
    if (divisions > 1 && bytes > kMinBlockSize * divisions) {
        // roundup_power2_next_division: the space between two powers of two in equal parts.
        const auto size = static_cast<uint64_t>(bytes);
        if (std::has_single_bit(size)) return bytes;
        const uint64_t floor = std::bit_floor(size);
        const uint64_t part = floor >> (std::bit_width(static_cast<uint64_t>(divisions)) - 1);
        if (part == 0) return static_cast<int64_t>(floor << 1);
        const uint64_t down = size & ~(part - 1);
        return static_cast<int64_t>(down == size ? size : down + part);
    }
    return kMinBlockSize * ((bytes + kMinBlockSize - 1) / kMinBlockSize);
}

int64_t CachingAllocatorModel::segmentSizeFor(int64_t blockBytes) {
    if (blockBytes <= kSmallSize) return kSmallBuffer;
    if (blockBytes < kMinLargeAlloc) return kLargeBuffer;
    return kRoundLarge * ((blockBytes + kRoundLarge - 1) / kRoundLarge);
}

void CachingAllocatorModel::addReserved(int64_t bytes) {
    m_stats.reservedBytes += bytes;
    m_stats.peakReservedBytes = std::max(m_stats.peakReservedBytes, m_stats.reservedBytes);
}

void CachingAllocatorModel::addAllocated(int64_t bytes, int64_t requested) {
    m_stats.allocatedBytes += bytes;
    m_stats.requestedBytes += requested;
    m_stats.peakAllocatedBytes = std::max(m_stats.peakAllocatedBytes, m_stats.allocatedBytes);
}

std::map<int64_t, CachingAllocatorModel::Block>::iterator CachingAllocatorModel::blockAt(int64_t address) {
    return m_blocks.find(address);
}

std::optional<int64_t> CachingAllocatorModel::bestFreeBlock(int64_t size, bool small) const {
    const FreeSet& free = small ? m_smallFree : m_largeFree;
    const auto it = free.lower_bound({size, std::numeric_limits<int64_t>::min()});
    if (it == free.end()) return std::nullopt;
    // get_free_block: an oversize block is not split for a small request, and a large request
    // takes an oversize block only when it wastes less than kLargeBuffer.
    const int64_t maxSplit = m_settings.maxSplitBytes;
    if (size < maxSplit && it->first >= maxSplit) return std::nullopt;
    if (size >= maxSplit && it->first >= size + kLargeBuffer) return std::nullopt;
    return it->second;
}

std::optional<int64_t> CachingAllocatorModel::newSegment(int64_t segmentBytes, bool small, bool retry) {
    if (retry) ++m_stats.allocRetries;  // alloc_block(…, isRetry): counted whether or not it succeeds
    if (m_limit > 0 && m_stats.reservedBytes + segmentBytes > m_limit) return std::nullopt;
    const int64_t address = m_nextAddress;
    m_nextAddress += segmentBytes + kRoundLarge;  // apart, so that no two segments touch
    Segment segment;
    segment.bytes = segmentBytes;
    segment.span = segmentBytes;
    segment.small = small;
    m_segments.emplace(address, std::move(segment));
    m_blocks.emplace(address, Block{address, segmentBytes, 0, address, false, small});
    pool(small).insert({segmentBytes, address});
    addReserved(segmentBytes);
    ++m_stats.segments;
    return address;
}

bool CachingAllocatorModel::shouldSplit(const Block& block, int64_t size) const {
    const int64_t remaining = block.bytes - size;
    if (block.small || m_settings.expandableSegments) return remaining >= kMinBlockSize;
    return size < m_settings.maxSplitBytes && remaining > kSmallSize;
}

int64_t CachingAllocatorModel::takeBlock(int64_t address, int64_t size, int64_t requested) {
    Block& block = blockAt(address)->second;
    pool(block.small).erase({block.bytes, address});
    if (shouldSplit(block, size)) {
        const Block rest{address + size, block.bytes - size, 0, block.segment, false, block.small};
        block.bytes = size;
        m_blocks.emplace(rest.address, rest);
        pool(rest.small).insert({rest.bytes, rest.address});
    }
    block.allocated = true;
    block.requested = requested;
    addAllocated(block.bytes, requested);
    return address;
}

tl::expected<int64_t, AllocationFailure> CachingAllocatorModel::allocate(int64_t bytes) {
    AllocationFailure failure;
    failure.requestedBytes = bytes;
    failure.limitBytes = m_limit;
    if (m_settings.exact) {
        if (m_limit > 0 && m_stats.allocatedBytes + bytes > m_limit) {
            ++m_stats.ooms;
            failure.blockBytes = failure.segmentBytes = bytes;
            failure.allocatedBytes = failure.reservedBytes = m_stats.allocatedBytes;
            return tl::unexpected(failure);
        }
        const int64_t address = m_nextAddress;
        m_nextAddress += std::max<int64_t>(bytes, 1);
        m_exactBlocks.emplace(address, bytes);
        addAllocated(bytes, bytes);
        addReserved(bytes);
        return address;
    }
    const int64_t size = roundSize(bytes);
    const bool small = size <= kSmallSize;
    failure.blockBytes = size;
    if (m_settings.expandableSegments) {
        auto placed = allocateExpandable(size, bytes, small);
        if (placed) return *placed;
        failure.segmentBytes = placed.error();
    } else {
        std::optional<int64_t> found = bestFreeBlock(size, small);
        if (!found) {
            const int64_t segmentBytes = segmentSizeFor(size);
            failure.segmentBytes = segmentBytes;
            found = newSegment(segmentBytes, small, false);
            // release_available_cached_blocks (only with max_split_size_mb), then
            // release_cached_blocks: every cached segment that is whole goes back, and one retry.
            if (!found && releaseOversizeBlocks(size, small)) found = newSegment(segmentBytes, small, false);
            if (!found) {
                releaseCachedSegments();
                found = newSegment(segmentBytes, small, true);
            }
        }
        if (found) return takeBlock(*found, size, bytes);
    }
    ++m_stats.ooms;
    failure.allocatedBytes = m_stats.allocatedBytes;
    failure.reservedBytes = m_stats.reservedBytes;
    const FreeSet& free = small ? m_smallFree : m_largeFree;
    failure.largestFreeBlock = free.empty() ? 0 : free.rbegin()->first;
    failure.fragmentation = m_limit > 0 && m_limit - m_stats.allocatedBytes >= size;
    return tl::unexpected(failure);
}

void CachingAllocatorModel::free(int64_t address) {
    if (m_settings.exact) {
        const auto it = m_exactBlocks.find(address);
        if (it == m_exactBlocks.end()) return;
        m_stats.allocatedBytes -= it->second;
        m_stats.requestedBytes -= it->second;
        m_stats.reservedBytes -= it->second;
        m_exactBlocks.erase(it);
        return;
    }
    auto it = blockAt(address);
    if (it == m_blocks.end() || !it->second.allocated) return;
    Block& block = it->second;
    block.allocated = false;
    m_stats.allocatedBytes -= block.bytes;
    m_stats.requestedBytes -= block.requested;
    block.requested = 0;
    // try_merge_blocks: with the free neighbours of the same segment, never across segments.
    if (it != m_blocks.begin()) {
        auto before = std::prev(it);
        Block& prev = before->second;
        if (!prev.allocated && prev.segment == block.segment && prev.address + prev.bytes == block.address) {
            pool(prev.small).erase({prev.bytes, prev.address});
            prev.bytes += block.bytes;
            m_blocks.erase(it);
            it = before;
        }
    }
    auto after = std::next(it);
    if (after != m_blocks.end()) {
        Block& next = after->second;
        Block& merged = it->second;
        if (!next.allocated && next.segment == merged.segment && merged.address + merged.bytes == next.address) {
            pool(next.small).erase({next.bytes, next.address});
            merged.bytes += next.bytes;
            m_blocks.erase(after);
        }
    }
    pool(it->second.small).insert({it->second.bytes, it->second.address});
}

void CachingAllocatorModel::releaseSegment(int64_t segmentAddress) {
    const auto segment = m_segments.find(segmentAddress);
    if (segment == m_segments.end()) return;
    const auto block = m_blocks.find(segmentAddress);
    if (block != m_blocks.end()) {
        pool(block->second.small).erase({block->second.bytes, block->first});
        m_blocks.erase(block);
    }
    m_stats.reservedBytes -= segment->second.bytes;
    --m_stats.segments;
    m_segments.erase(segment);
}

bool CachingAllocatorModel::releaseOversizeBlocks(int64_t size, bool small) {
    const int64_t maxSplit = m_settings.maxSplitBytes;
    if (maxSplit == std::numeric_limits<int64_t>::max()) return false;
    FreeSet& free = pool(small);
    const int64_t key = size < maxSplit ? maxSplit : size;
    const auto whole = [&](const std::pair<int64_t, int64_t>& entry) {
        const auto segment = m_segments.find(entry.second);
        return segment != m_segments.end() && !segment->second.expandable && segment->second.bytes == entry.first;
    };
    auto it = free.lower_bound({key, std::numeric_limits<int64_t>::min()});
    if (it != free.end()) {
        if (!whole(*it)) return false;
        releaseSegment(it->second);
        return true;
    }
    // No single block is large enough: free oversize blocks, the largest first.
    int64_t released = 0;
    std::vector<int64_t> toRelease;
    for (auto r = free.rbegin(); r != free.rend() && released < key && r->first >= maxSplit; ++r) {
        if (!whole(*r)) continue;
        toRelease.push_back(r->second);
        released += r->first;
    }
    if (released < key) return false;
    for (const int64_t address : toRelease) releaseSegment(address);
    return true;
}

void CachingAllocatorModel::releaseCachedSegments() {
    std::vector<int64_t> whole;
    for (const auto& [address, segment] : m_segments) {
        if (segment.expandable) continue;
        const auto block = m_blocks.find(address);
        if (block != m_blocks.end() && !block->second.allocated && block->second.bytes == segment.bytes) {
            whole.push_back(address);
        }
    }
    for (const int64_t address : whole) releaseSegment(address);
    unmapFreePages();
}

void CachingAllocatorModel::emptyCache() {
    if (!m_settings.exact) releaseCachedSegments();
}

// ---------------------------------------------------------------------------------------------
// Expandable segments: one segment per pool whose address range grows; physical pages (2 MiB for
// the small pool, 20 MiB for the large one) are mapped when a block needs them and unmapped by
// the cache flush when no allocated block touches them. Reserved is the mapped pages.

int64_t CachingAllocatorModel::pagesToMap(const Segment& segment, int64_t begin, int64_t end, bool small) const {
    const int64_t page = pageBytes(small);
    int64_t count = 0;
    for (int64_t p = begin / page; p * page < end; ++p) {
        if (p >= static_cast<int64_t>(segment.mappedPages.size()) || !segment.mappedPages[p]) ++count;
    }
    return count;
}

void CachingAllocatorModel::mapPages(Segment& segment, int64_t begin, int64_t end, bool small) {
    const int64_t page = pageBytes(small);
    for (int64_t p = begin / page; p * page < end; ++p) {
        if (p >= static_cast<int64_t>(segment.mappedPages.size())) segment.mappedPages.resize(p + 1, false);
        if (!segment.mappedPages[p]) {
            segment.mappedPages[p] = true;
            segment.bytes += page;
            addReserved(page);
        }
    }
}

void CachingAllocatorModel::unmapFreePages() {
    for (auto& [address, segment] : m_segments) {
        if (!segment.expandable) continue;
        const int64_t page = pageBytes(segment.small);
        for (auto it = m_blocks.lower_bound(address); it != m_blocks.end() && it->second.segment == address; ++it) {
            const Block& block = it->second;
            if (block.allocated) continue;
            const int64_t offset = block.address - address;
            const int64_t first = (offset + page - 1) / page;    // pages wholly inside the block
            const int64_t last = (offset + block.bytes) / page;  // exclusive
            for (int64_t p = first; p < last && p < static_cast<int64_t>(segment.mappedPages.size()); ++p) {
                if (segment.mappedPages[p]) {
                    segment.mappedPages[p] = false;
                    segment.bytes -= page;
                    m_stats.reservedBytes -= page;
                }
            }
        }
    }
}

tl::expected<int64_t, int64_t> CachingAllocatorModel::allocateExpandable(int64_t size, int64_t requested, bool small) {
    // The pool's segment, made on first use with an empty address range.
    int64_t segmentAddress = 0;
    for (const auto& [address, segment] : m_segments) {
        if (segment.expandable && segment.small == small) segmentAddress = address;
    }
    if (segmentAddress == 0) {
        segmentAddress = m_nextAddress;
        m_nextAddress += int64_t{1} << 40;  // room to grow
        Segment segment;
        segment.small = small;
        segment.expandable = true;
        m_segments.emplace(segmentAddress, std::move(segment));
        ++m_stats.segments;
    }
    Segment& segment = m_segments.at(segmentAddress);
    std::optional<int64_t> found = bestFreeBlock(size, small);
    if (!found) {
        // Grow the range at its end: the free block there (if any) becomes large enough.
        const int64_t page = pageBytes(small);
        auto last = m_blocks.end();
        for (auto it = m_blocks.lower_bound(segmentAddress);
             it != m_blocks.end() && it->second.segment == segmentAddress; ++it) {
            last = it;
        }
        const bool tailFree = last != m_blocks.end() && !last->second.allocated;
        const int64_t have = tailFree ? last->second.bytes : 0;
        const int64_t grow = (size - have + page - 1) / page * page;
        if (tailFree) {
            pool(small).erase({last->second.bytes, last->first});
            last->second.bytes += grow;
            pool(small).insert({last->second.bytes, last->first});
            found = last->first;
        } else {
            const int64_t address = segmentAddress + segment.span;
            m_blocks.emplace(address, Block{address, grow, 0, segmentAddress, false, small});
            pool(small).insert({grow, address});
            found = address;
        }
        segment.span += grow;
    }
    const int64_t begin = *found - segmentAddress;
    const int64_t needed = pagesToMap(segment, begin, begin + size, small) * pageBytes(small);
    if (m_limit > 0 && m_stats.reservedBytes + needed > m_limit) {
        releaseCachedSegments();
        ++m_stats.allocRetries;
        const int64_t after = pagesToMap(segment, begin, begin + size, small) * pageBytes(small);
        if (m_stats.reservedBytes + after > m_limit) return tl::unexpected(after);
    }
    mapPages(segment, begin, begin + size, small);
    return takeBlock(*found, size, requested);
}

std::vector<SegmentView> CachingAllocatorModel::segments() const {
    std::vector<SegmentView> views;
    if (m_settings.exact) {
        for (const auto& [address, bytes] : m_exactBlocks) {
            views.push_back({address, bytes, false, false, {{0, bytes, bytes, true, true}}});
        }
        return views;
    }
    for (const auto& [address, segment] : m_segments) {
        SegmentView view{address, segment.bytes, segment.small, segment.expandable, {}};
        const int64_t page = pageBytes(segment.small);
        for (auto it = m_blocks.lower_bound(address); it != m_blocks.end() && it->second.segment == address; ++it) {
            const Block& block = it->second;
            bool mapped = true;
            if (segment.expandable) {
                mapped = false;
                const int64_t offset = block.address - address;
                for (int64_t p = offset / page; p * page < offset + block.bytes; ++p) {
                    if (p < static_cast<int64_t>(segment.mappedPages.size()) && segment.mappedPages[p]) mapped = true;
                }
            }
            view.blocks.push_back({block.address - address, block.bytes, block.requested, block.allocated, mapped});
        }
        views.push_back(std::move(view));
    }
    return views;
}

// ---------------------------------------------------------------------------------------------
// CUDA's message

std::string formatSizeAsPyTorch(int64_t bytes) {
    char text[64];
    const auto size = static_cast<double>(bytes);
    if (bytes <= 1024) {
        std::snprintf(text, sizeof text, "%lld bytes", static_cast<long long>(bytes));
    } else if (bytes <= 1048576) {
        std::snprintf(text, sizeof text, "%.2f KiB", size / 1024.0);
    } else if (bytes <= 1073741824LL) {
        std::snprintf(text, sizeof text, "%.2f MiB", size / 1048576.0);
    } else {
        std::snprintf(text, sizeof text, "%.2f GiB", size / 1073741824.0);
    }
    return text;
}

std::string cudaOutOfMemoryText(const AllocationFailure& failure, int device) {
    const int64_t freeBytes = std::max<int64_t>(0, failure.limitBytes - failure.reservedBytes);
    return "CUDA out of memory. Tried to allocate " + formatSizeAsPyTorch(failure.segmentBytes) + ". GPU " +
           std::to_string(device) + " has a total capacity of " + formatSizeAsPyTorch(failure.limitBytes) +
           " of which " + formatSizeAsPyTorch(freeBytes) + " is free. Including non-PyTorch memory, this process has " +
           formatSizeAsPyTorch(failure.reservedBytes) + " memory in use. Of the allocated memory " +
           formatSizeAsPyTorch(failure.allocatedBytes) + " is allocated by PyTorch, and " +
           formatSizeAsPyTorch(failure.reservedBytes - failure.allocatedBytes) +
           " is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
           "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";
}

namespace {

/// "20.00 MiB" (or "512 bytes") at `at` in `text`, in bytes; advances `at` past it.
std::optional<int64_t> sizeAt(std::string_view text, size_t& at) {
    size_t end = at;
    while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) ++end;
    if (end == at) return std::nullopt;
    double value = 0;
    const auto [stop, ec] = std::from_chars(text.data() + at, text.data() + end, value);
    if (ec != std::errc{} || stop != text.data() + end) return std::nullopt;
    if (end >= text.size() || text[end] != ' ') return std::nullopt;
    const std::string_view rest = text.substr(end + 1);
    static const std::pair<std::string_view, double> kUnits[] = {
        {"bytes", 1.0}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    for (const auto& [unit, scale] : kUnits) {
        if (rest.substr(0, unit.size()) == unit) {
            at = end + 1 + unit.size();
            return static_cast<int64_t>(value * scale + 0.5);
        }
    }
    return std::nullopt;
}

std::optional<int64_t> sizeAfter(std::string_view text, std::string_view marker) {
    size_t at = text.find(marker);
    if (at == std::string_view::npos) return std::nullopt;
    at += marker.size();
    return sizeAt(text, at);
}

}  // namespace

std::optional<CudaOomNumbers> parseCudaOutOfMemoryText(std::string_view text) {
    if (text.find("out of memory") == std::string_view::npos) return std::nullopt;
    const auto tried = sizeAfter(text, "Tried to allocate ");
    if (!tried) return std::nullopt;
    CudaOomNumbers numbers;
    numbers.triedBytes = *tried;
    numbers.totalBytes = sizeAfter(text, "has a total capacity of ").value_or(0);
    numbers.freeBytes = sizeAfter(text, " of which ").value_or(0);
    numbers.allocatedBytes = sizeAfter(text, "Of the allocated memory ").value_or(0);
    numbers.reservedUnallocatedBytes = sizeAfter(text, "is allocated by PyTorch, and ").value_or(0);
    numbers.allowedBytes = sizeAfter(text, "memory in use. ").value_or(0);
    return numbers;
}

int64_t CudaOomNumbers::reservableBytes() const {
    if (allowedBytes <= 0) return freeBytes;
    const int64_t underCap = std::max<int64_t>(0, allowedBytes - allocatedBytes - reservedUnallocatedBytes);
    return std::min(freeBytes, underCap);
}

std::string describeCudaOom(const CudaOomNumbers& n, bool expandableSegments) {
    const std::string tried = formatSizeAsPyTorch(n.triedBytes);
    const int64_t reservable = n.reservableBytes();
    const std::string free = formatSizeAsPyTorch(reservable) + (n.allowedBytes > 0 ? " free under the cap" : " free");
    if (reservable + n.reservedUnallocatedBytes >= n.triedBytes) {
        return "fragmentation: " + formatSizeAsPyTorch(n.reservedUnallocatedBytes) + " reserved but unallocated and " +
               free + ", yet no block of " + tried +
               (expandableSegments
                    ? "; expandable_segments is on already, so a smaller micro-batch avoids it"
                    : "; expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF, or after a virtual device's name) or a "
                      "smaller micro-batch avoids it");
    }
    return "exhaustion: " + formatSizeAsPyTorch(n.allocatedBytes) + " in tensors, " +
           formatSizeAsPyTorch(reservable + n.reservedUnallocatedBytes) + " left for " + tried +
           (n.allowedBytes > 0 ? " under the cap of " + formatSizeAsPyTorch(n.allowedBytes) : std::string());
}

}  // namespace batchpilot::core
