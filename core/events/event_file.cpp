#include "core/events/event_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <memory>
#include <utility>

#include "core/events/event_json.h"

namespace batchpilot::core {
namespace {

struct CloseFile {
    void operator()(std::FILE* file) const { std::fclose(file); }
};

}  // namespace

EventFileFollower::EventFileFollower(std::string path) : m_path(std::move(path)) {}

void EventFileFollower::skip(const std::string& why, Batch& batch) {
    if (++m_skippedLines <= kMaxDescribedSkips) batch.skipped.push_back("line " + std::to_string(m_lines) + ": " + why);
}

void EventFileFollower::takeLine(const char* begin, const char* end, Batch& batch) {
    ++m_lines;
    if (m_discarded > 0) {
        skip("longer than " + std::to_string(kMaxEventLineBytes >> 20) + " MiB (" +
                 std::to_string(static_cast<int64_t>(m_pending.size()) + m_discarded + (end - begin)) +
                 " bytes): not an event",
             batch);
        m_pending.clear();
        m_discarded = 0;
        return;
    }
    std::string_view line(begin, static_cast<size_t>(end - begin));
    if (!m_pending.empty()) {
        m_pending.append(line);
        line = m_pending;
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") != std::string_view::npos) {
        auto event = eventFromJsonLine(line);
        if (event)
            batch.events.push_back(std::move(*event));
        else
            skip(event.error(), batch);
    }
    m_pending.clear();
}

tl::expected<EventFileFollower::Batch, std::string> EventFileFollower::read(size_t maxBytes) {
    const std::unique_ptr<std::FILE, CloseFile> file(std::fopen(m_path.c_str(), "rb"));
    if (!file) return tl::unexpected(m_path + " cannot be read: " + std::strerror(errno));
    struct stat status {};
    if (::fstat(::fileno(file.get()), &status) != 0)
        return tl::unexpected(m_path + " cannot be read: " + std::strerror(errno));
    if (!S_ISREG(status.st_mode)) return tl::unexpected(m_path + " is not a file");
    const int64_t size = status.st_size;
    const int64_t position = m_offset + pendingBytes();
    if (size < position) {
        return tl::unexpected(m_path + " is shorter (" + std::to_string(size) + " bytes) than what was read of it (" +
                              std::to_string(position) +
                              " bytes): it was replaced or cut; open the run again to read it from its start");
    }
    m_fileBytes = size;
    Batch batch;
    if (::fseeko(file.get(), position, SEEK_SET) != 0)
        return tl::unexpected(m_path + " cannot be read: " + std::strerror(errno));
    std::string buffer(std::max<size_t>(maxBytes, 4096), '\0');
    int64_t at = position;
    // Read at least to the end of one line (or the file), then stop at a line's end near maxBytes.
    while (at < size) {
        const size_t want = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(buffer.size()), size - at));
        const size_t got = std::fread(buffer.data(), 1, want, file.get());
        if (got == 0) {
            if (std::ferror(file.get())) return tl::unexpected(m_path + " cannot be read: " + std::strerror(errno));
            break;  // shorter than its size said: a writer between fstat and here; the rest next time
        }
        at += static_cast<int64_t>(got);
        const char* begin = buffer.data();
        const char* const end = begin + got;
        bool lineEnded = false;
        while (begin < end) {
            const auto* newline = static_cast<const char*>(std::memchr(begin, '\n', static_cast<size_t>(end - begin)));
            if (newline == nullptr) {
                // The line goes on past this buffer: keep it while it is within the limit.
                const size_t rest = static_cast<size_t>(end - begin);
                if (m_discarded == 0 && m_pending.size() + rest <= kMaxEventLineBytes) {
                    m_pending.append(begin, rest);
                } else {
                    m_discarded += static_cast<int64_t>(m_pending.size() + rest);
                    m_pending.clear();
                }
                break;
            }
            takeLine(begin, newline, batch);
            begin = newline + 1;
            lineEnded = true;
        }
        if (lineEnded) break;
    }
    m_offset = at - pendingBytes();
    batch.atEnd = at >= size;
    return batch;
}

}  // namespace batchpilot::core
