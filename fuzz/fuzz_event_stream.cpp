// The event stream of a served run as the window connected to it reads it (ui/session/remote_run.cpp
// through core::EventStreamReader): bytes from a server that may send anything, cut anywhere.
// Checked: what is read does not depend on where the bytes are cut (the whole input at once against
// pieces of 1 to 97 bytes the input chooses); the reader never holds more than one record's most
// beyond the piece appended last, however long a record claims to be; ids only grow; every event
// read writes back to a line that reads back into the same event; and no event holds a number no
// run can have (core/events/event_limits.h). The most of a record is 512 bytes here, so that the
// records dropped as too long are reached.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/events/event_json.h"
#include "core/events/event_stream.h"
#include "fuzz/event_checks.h"

using namespace batchpilot::core;

namespace {

constexpr size_t kMaxRecord = 512;

/// Each record read, as a line: its id and its event's JSON line, or its error.
void take(EventStreamReader& reader, std::string& out, int64_t& lastId) {
    while (auto record = reader.next()) {
        if (record->id != 0) {
            if (record->id <= lastId || record->id != reader.lastId()) std::abort();
            lastId = record->id;
        }
        out += std::to_string(record->id) + ' ';
        if (!record->event) {
            if (record->event.error().empty()) std::abort();
            out += "! " + record->event.error() + '\n';
            continue;
        }
        if (!batchpilot::fuzz::possible(toJson(*record->event))) std::abort();
        const std::string line = toJsonLine(*record->event);
        const auto again = eventFromJsonLine(line);
        if (!again || toJsonLine(*again) != line) std::abort();
        out += line + '\n';
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);

    EventStreamReader whole(kMaxRecord);
    whole.append(input);
    std::string wholeRead;
    int64_t wholeLast = 0;
    take(whole, wholeRead, wholeLast);

    EventStreamReader pieces(kMaxRecord);
    std::string piecesRead;
    int64_t piecesLast = 0;
    for (size_t at = 0, i = 0; at < size; ++i) {
        const size_t length = std::min<size_t>(size - at, 1 + data[(i * 7) % size] % 97);
        pieces.append(input.substr(at, length));
        at += length;
        // A record not yet whole, and the piece that came last: nothing more is held.
        if (pieces.held() > kMaxRecord + 2 + length) std::abort();
        take(pieces, piecesRead, piecesLast);
        if (pieces.held() > kMaxRecord + 2) std::abort();
    }
    if (piecesRead != wholeRead || piecesLast != wholeLast || pieces.lastId() != whole.lastId()) std::abort();
    return 0;
}
