#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

#include "core/events/event_json.h"
#include "core/events/events.h"

namespace batchpilot::core {

/// One record of a served run's event stream, read: its event, or why it is not one.
struct StreamRecord {
    int64_t id = 0;  ///< its "id:" line; 0 where it has none (or one that is not a number)
    tl::expected<Event, std::string> event;
};

/// Reads the event stream of `batchpilot-cli --serve` (text/event-stream: records of "id: N" and
/// "data: " with one event's JSON line, each ended by an empty line) as it arrives, cut anywhere.
/// It holds at most one record beyond what was appended last: a record longer than `maxRecord`
/// bytes is dropped as it comes, never held whole, and reported once. Records whose id is not
/// past the last one received are passed over (a server that repeats), as are records without
/// data (the comments that keep a connection alive). How the bytes are cut never changes what is
/// read.
class EventStreamReader {
public:
    /// A record's most: an event's line (kMaxEventLineBytes) and its "id:" and "data:" lines.
    static constexpr size_t kMaxRecordBytes = kMaxEventLineBytes + 64;

    explicit EventStreamReader(size_t maxRecord = kMaxRecordBytes) : m_maxRecord(maxRecord) {}

    /// The stream's next bytes. Call next() until it has nothing before appending more: the
    /// reader then holds at most `bytes` and one record's most.
    void append(std::string_view bytes) { m_buffer.append(bytes); }
    /// The next record that has data, or nullopt when no whole one is held.
    std::optional<StreamRecord> next();
    /// A new connection: the record it was cut in is dropped; the last id received is kept, to
    /// ask the server for what follows it.
    void restart();

    /// The last id received (ids count from 1), 0 before any.
    int64_t lastId() const { return m_lastId; }
    /// The bytes held, to be read.
    size_t held() const { return m_buffer.size() - m_at; }

private:
    std::string tooLongText() const;

    std::string m_buffer;
    size_t m_at = 0;  ///< the buffer's unread part starts here
    size_t m_maxRecord;
    int64_t m_lastId = 0;
    bool m_skipping = false;  ///< dropping a record longer than m_maxRecord, until its end
};

}  // namespace batchpilot::core
