#include "core/memory/memory_snapshot.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace batchpilot::core {
namespace {

// Pickle protocol 2's opcodes (Python's Lib/pickle.py), the few a snapshot needs.
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kEmptyDict = '}';
constexpr char kSetItems = 'u';
constexpr char kEmptyList = ']';
constexpr char kAppends = 'e';
constexpr char kBinUnicode = 'X';
constexpr char kBinInt = 'J';
constexpr char kLong1 = '\x8a';
constexpr char kTrue = '\x88';
constexpr char kFalse = '\x89';

class Pickler {
public:
    Pickler() {
        m_out += kProto;
        m_out += '\x02';
    }
    void text(std::string_view s) {
        m_out += kBinUnicode;
        littleEndian(static_cast<uint64_t>(s.size()), 4);
        m_out += s;
    }
    void integer(int64_t v) {
        if (v >= INT32_MIN && v <= INT32_MAX) {
            m_out += kBinInt;
            littleEndian(static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
            return;
        }
        // LONG1: the two's complement in as few bytes as hold the sign.
        int bytes = 1;
        while (bytes < 8) {
            const int64_t low = -(int64_t{1} << (8 * bytes - 1));
            const int64_t high = (int64_t{1} << (8 * bytes - 1)) - 1;
            if (v >= low && v <= high) break;
            ++bytes;
        }
        m_out += kLong1;
        m_out += static_cast<char>(bytes);
        littleEndian(static_cast<uint64_t>(v), bytes);
    }
    void boolean(bool v) { m_out += v ? kTrue : kFalse; }
    /// A dictionary: `items` writes key, value, key, value, …
    template <typename Items>
    void dict(Items items) {
        m_out += kEmptyDict;
        m_out += kMark;
        items();
        m_out += kSetItems;
    }
    /// A list of `count` elements written by `element(i)`.
    template <typename Element>
    void list(size_t count, Element element) {
        m_out += kEmptyList;
        if (count == 0) return;
        m_out += kMark;
        for (size_t i = 0; i < count; ++i) element(i);
        m_out += kAppends;
    }
    std::string finish() {
        m_out += kStop;
        return std::move(m_out);
    }

private:
    void littleEndian(uint64_t v, int bytes) {
        for (int i = 0; i < bytes; ++i) m_out += static_cast<char>((v >> (8 * i)) & 0xff);
    }
    std::string m_out;
};

}  // namespace

std::string memorySnapshotPickle(const std::vector<SegmentView>& segments) {
    Pickler p;
    const auto noFrames = [&] { p.list(0, [](size_t) {}); };
    p.dict([&] {
        p.text("segments");
        p.list(segments.size(), [&](size_t i) {
            const SegmentView& segment = segments[i];
            // An expandable segment maps pages, not blocks: its free blocks are partly mapped. Its
            // allocated blocks are listed, and its mapped free bytes as one cached block after
            // them, so that the blocks add up to what it reserves (PyTorch's tools check that).
            std::vector<BlockView> blocks;
            int64_t allocated = 0;
            int64_t requested = 0;
            int64_t end = 0;
            for (const BlockView& b : segment.blocks) {
                if (b.allocated) {
                    allocated += b.bytes;
                    requested += b.requestedBytes;
                }
                if (segment.expandable && !b.allocated) continue;
                blocks.push_back(b);
                end = std::max(end, b.offset + b.bytes);
            }
            if (segment.expandable && segment.bytes > allocated)
                blocks.push_back({end, segment.bytes - allocated, 0, false, true});
            p.dict([&] {
                p.text("device");
                p.integer(0);
                p.text("address");
                p.integer(segment.address);
                p.text("total_size");
                p.integer(segment.bytes);
                p.text("allocated_size");
                p.integer(allocated);
                p.text("active_size");
                p.integer(allocated);
                p.text("requested_size");
                p.integer(requested);
                p.text("stream");
                p.integer(0);
                p.text("segment_type");
                p.text(segment.smallPool ? "small" : "large");
                p.text("is_expandable");
                p.boolean(segment.expandable);
                p.text("frames");
                noFrames();
                p.text("blocks");
                p.list(blocks.size(), [&](size_t j) {
                    const BlockView& b = blocks[j];
                    p.dict([&] {
                        p.text("address");
                        p.integer(segment.address + b.offset);
                        p.text("size");
                        p.integer(b.bytes);
                        p.text("requested_size");
                        p.integer(b.allocated ? b.requestedBytes : 0);
                        p.text("state");
                        p.text(b.allocated ? "active_allocated" : "inactive");
                        p.text("frames");
                        noFrames();
                    });
                });
            });
        });
        p.text("device_traces");
        p.list(1, [&](size_t) { p.list(0, [](size_t) {}); });
    });
    return p.finish();
}

}  // namespace batchpilot::core
