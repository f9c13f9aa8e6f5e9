#include "app/request_head.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace batchpilot::app {
namespace {

bool isTokenChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

std::string_view trimmed(std::string_view text) {
    while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
    while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
    return text;
}

}  // namespace

bool equalsIgnoringCase(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
}

const std::string* RequestHead::header(std::string_view name) const {
    for (const auto& [key, value] : headers)
        if (equalsIgnoringCase(key, name)) return &value;
    return nullptr;
}

std::string_view RequestHead::path() const {
    const std::string_view whole(target);
    return whole.substr(0, whole.find('?'));
}

std::optional<std::string_view> RequestHead::param(std::string_view key) const {
    const size_t question = target.find('?');
    if (question == std::string::npos) return std::nullopt;
    std::string_view query = std::string_view(target).substr(question + 1);
    while (!query.empty()) {
        const size_t amp = query.find('&');
        const std::string_view pair = query.substr(0, amp);
        const size_t equals = pair.find('=');
        if (pair.substr(0, equals) == key)
            return equals == std::string_view::npos ? std::string_view() : pair.substr(equals + 1);
        if (amp == std::string_view::npos) break;
        query.remove_prefix(amp + 1);
    }
    return std::nullopt;
}

tl::expected<RequestHead, Refusal> parseRequestHead(std::string_view head, const HeadLimits& limits) {
    const auto bad = [](std::string message) { return tl::unexpected(Refusal{400, std::move(message)}); };
    if (head.size() > limits.maxHeadBytes)
        return tl::unexpected(Refusal{431, "the request's headers are over " + std::to_string(limits.maxHeadBytes) +
                                               " bytes: send fewer or shorter headers"});
    RequestHead parsed;
    size_t at = 0;
    bool first = true;
    for (;;) {
        const size_t end = head.find("\r\n", at);
        if (end == std::string_view::npos) return bad("a header line does not end with CRLF");
        const std::string_view line = head.substr(at, end - at);
        at = end + 2;
        if (line.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos)
            return bad("a header line holds a stray CR, LF or NUL byte");
        if (first) {
            first = false;
            const size_t space1 = line.find(' ');
            const size_t space2 = space1 == std::string_view::npos ? space1 : line.find(' ', space1 + 1);
            if (space2 == std::string_view::npos || line.find(' ', space2 + 1) != std::string_view::npos)
                return bad("the request line is not \"METHOD /path HTTP/1.1\"");
            parsed.method = line.substr(0, space1);
            parsed.target = line.substr(space1 + 1, space2 - space1 - 1);
            parsed.version = line.substr(space2 + 1);
            if (parsed.method.empty() || !std::all_of(parsed.method.begin(), parsed.method.end(), isTokenChar) ||
                parsed.target.empty() || parsed.target.front() != '/' ||
                (parsed.version != "HTTP/1.1" && parsed.version != "HTTP/1.0"))
                return bad("the request line is not \"METHOD /path HTTP/1.1\"");
            continue;
        }
        if (line.empty()) break;
        const size_t colon = line.find(':');
        const std::string_view name = line.substr(0, colon == std::string_view::npos ? 0 : colon);
        if (name.empty() || !std::all_of(name.begin(), name.end(), isTokenChar))
            return bad("a header line is not \"Name: value\"");
        if (parsed.headers.size() >= limits.maxHeaders)
            return tl::unexpected(Refusal{
                431, "the request has more than " + std::to_string(limits.maxHeaders) + " headers: send fewer"});
        parsed.headers.emplace_back(std::string(name), std::string(trimmed(line.substr(colon + 1))));
    }
    if (at != head.size()) return bad("bytes after the end of the request's headers");
    return parsed;
}

}  // namespace batchpilot::app
