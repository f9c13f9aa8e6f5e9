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

/// Characters of a value a message quotes at most (quoteForMessage()).
inline constexpr size_t kMaxQuotedChars = 200;

/// At most kMaxQuotedChars bytes of `text` (cut where a UTF-8 character starts), with "…" where
/// it was cut: a value read from a file can be megabytes long, and a message that repeats it
/// drowns what it says.
inline std::string cutForMessage(const std::string& text) {
    if (text.size() <= kMaxQuotedChars) return text;
    size_t cut = kMaxQuotedChars;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    return text.substr(0, cut) + "\u2026";
}

/// `text` in double quotes for a message, cut as cutForMessage does, then its length where it
/// was cut: "abc…" (52428800 bytes).
inline std::string quoteForMessage(const std::string& text) {
    std::string out = "\"" + cutForMessage(text) + "\"";
    if (text.size() > kMaxQuotedChars) out += " (" + std::to_string(text.size()) + " bytes)";
    return out;
}

}  // namespace batchpilot::core
