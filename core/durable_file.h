#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

namespace batchpilot::core {

/// Writes every part to the open file `fd` in order (retrying short writes and EINTR), then
/// fsyncs it, so its contents are on disk before the caller renames it over what it replaces.
/// On failure returns the system's reason (e.g. "No space left on device"). Does not close `fd`.
tl::expected<void, std::string> writeAllAndSync(int fd, std::initializer_list<std::string_view> parts);

}  // namespace batchpilot::core
