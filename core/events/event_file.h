#pragma once

// Reading an events file back as it grows: a run folder's events.jsonl, written by a run that may
// still be going, in this process or another, on this machine or another one whose folder is
// mounted here (sshfs, NFS). Torch-free; the desktop app's File → Open run reads runs through this.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "core/events/events.h"

namespace batchpilot::core {

/// Reads an events file (toJsonLine's lines) from its start, and on every read() what was added
/// since: the events of the complete lines, in order. A last line without its newline yet (a run
/// writing it now, or one killed while it wrote it) is held back until the newline arrives; a line
/// that is not an event (damage, a line of a newer BatchPilot's unknown type, a line over
/// kMaxEventLineBytes) is skipped, counted and described. Memory stays what one read() asks for
/// plus one bounded line, whatever the file holds. The file is opened anew by every read(), so
/// a network file system's client shows what the writer has written since (close-to-open).
class EventFileFollower {
public:
    explicit EventFileFollower(std::string path);

    struct Batch {
        std::vector<Event> events;
        /// "line 17: not JSON (a line cut off, or damaged)", for each line skipped in this read
        /// (at most kMaxDescribedSkips over the file; skippedLines() counts them all).
        std::vector<std::string> skipped;
        /// The file ended where this read stopped (its last bytes may be an incomplete line,
        /// pendingBytes()); false: more is there already, read again.
        bool atEnd = false;
    };
    static constexpr int kMaxDescribedSkips = 20;

    /// Reads about `maxBytes` more of the file (at least to the end of one line). Fails when the
    /// file cannot be read, or is shorter than what was read already (replaced or truncated: read
    /// from the start with a new follower).
    tl::expected<Batch, std::string> read(size_t maxBytes = size_t{4} << 20);

    const std::string& path() const { return m_path; }
    /// Bytes of the file read so far, up to the end of the last complete line.
    int64_t bytesRead() const { return m_offset; }
    /// The file's size when it was last read.
    int64_t fileBytes() const { return m_fileBytes; }
    /// Bytes after the last newline: a line not complete yet.
    int64_t pendingBytes() const { return static_cast<int64_t>(m_pending.size()) + m_discarded; }
    int64_t lines() const { return m_lines; }
    int64_t skippedLines() const { return m_skippedLines; }

private:
    void takeLine(const char* begin, const char* end, Batch& batch);
    void skip(const std::string& why, Batch& batch);

    std::string m_path;
    int64_t m_offset = 0;     ///< where the first line not read completely starts
    int64_t m_fileBytes = 0;  ///< the size at the last read
    std::string m_pending;    ///< that line's bytes read so far (kept while within the limit)
    int64_t m_discarded = 0;  ///< that line's bytes past kMaxEventLineBytes (not kept)
    int64_t m_lines = 0;
    int64_t m_skippedLines = 0;
};

}  // namespace batchpilot::core
