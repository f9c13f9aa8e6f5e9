#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

namespace batchpilot::core {

/// Writes every part to the open file `fd` in order (retrying short writes and EINTR). On
/// failure returns the system's reason (e.g. "No space left on device"). Does not close `fd`.
tl::expected<void, std::string> writeAll(int fd, std::initializer_list<std::string_view> parts);

/// writeAll, then fsyncs the file, so its contents are on disk before the caller renames it over what it replaces.
/// On failure returns the system's reason (e.g. "No space left on device"). Does not close `fd`.
tl::expected<void, std::string> writeAllAndSync(int fd, std::initializer_list<std::string_view> parts);

/// Why BatchPilot will not write a file at `path`: something other than a regular file is there
/// (a symbolic link, which is not followed, a folder, a FIFO, a socket or a device). Empty when the
/// path holds a regular file or nothing yet. `named` names the file in the message.
std::string whyNotWritable(const std::string& path, const std::string& named);

/// Replaces `path` with `text` atomically: a unique temporary beside it (never an existing file),
/// written and fsynced, then renamed over it, so a crash leaves the old file or the new one. Only
/// a regular file (or nothing) at `path` is replaced: a symbolic link, folder, FIFO or device is
/// left as it is. Messages name the file as `named` (e.g. "the configuration \"run.json\"").
tl::expected<void, std::string> replaceFileAtomically(const std::string& path, std::string_view text,
                                                      const std::string& named);

}  // namespace batchpilot::core
