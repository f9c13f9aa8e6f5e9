#include "core/events/event_stream.h"

#include <algorithm>
#include <charconv>

namespace batchpilot::core {
namespace {

int64_t idOf(std::string_view text) {
    int64_t id = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), id);
    return error == std::errc() && end == text.data() + text.size() && id > 0 ? id : 0;
}

}  // namespace

std::string EventStreamReader::tooLongText() const {
    const std::string most = m_maxRecord >= (size_t{1} << 20) ? std::to_string(m_maxRecord >> 20) + " MiB"
                                                              : std::to_string(m_maxRecord) + " bytes";
    return "a record longer than " + most + ", which no event is";
}

void EventStreamReader::restart() {
    m_buffer.clear();
    m_at = 0;
    m_skipping = false;
}

std::optional<StreamRecord> EventStreamReader::next() {
    for (;;) {
        const size_t end = m_buffer.find("\n\n", m_at);
        if (end == std::string::npos) {
            // No end in sight. Held without one, these bytes are a record of at least their
            // count less one (the last may begin the end): past the most, it is dropped as it
            // comes, the last byte kept.
            const bool tooLong = !m_skipping && m_buffer.size() - m_at > m_maxRecord + 1;
            if ((m_skipping || tooLong) && !m_buffer.empty()) m_at = std::max(m_at, m_buffer.size() - 1);
            m_buffer.erase(0, m_at);
            m_at = 0;
            if (!tooLong) return std::nullopt;
            m_skipping = true;
            return StreamRecord{0, tl::unexpected(tooLongText())};
        }
        const std::string_view record = std::string_view(m_buffer).substr(m_at, end - m_at);
        m_at = end + 2;
        if (m_skipping) {  // the end of the long record
            m_skipping = false;
            continue;
        }
        if (record.size() > m_maxRecord) return StreamRecord{0, tl::unexpected(tooLongText())};
        std::string_view data;
        int64_t id = 0;
        for (size_t line = 0; line < record.size();) {
            const size_t newline = std::min(record.find('\n', line), record.size());
            const std::string_view text = record.substr(line, newline - line);
            if (text.starts_with("id: ")) id = idOf(text.substr(4));
            if (text.starts_with("data: ")) data = text.substr(6);
            line = newline + 1;
        }
        if (data.empty()) continue;              // a comment that keeps the connection alive
        if (id > 0 && id <= m_lastId) continue;  // received already
        if (id > 0) m_lastId = id;
        return StreamRecord{id, eventFromJsonLine(data)};
    }
}

}  // namespace batchpilot::core
