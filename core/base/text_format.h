#pragma once

#include <cstdio>
#include <string>

namespace batchpilot::core {

/// printf-style formatting into a std::string, for messages and text tables. Output past 511
/// bytes is cut off.
template <typename... Args>
std::string formatText(const char* pattern, Args... values) {
    char buffer[512];
    std::snprintf(buffer, sizeof buffer, pattern, values...);
    return buffer;
}

}  // namespace batchpilot::core
