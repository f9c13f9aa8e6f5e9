#pragma once

// A request to `--serve` as the gate reads it before anything else sees it (app/request_gate.h):
// its line and headers, parsed strictly and within limits, and why one is refused.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tl/expected.hpp>

namespace batchpilot::app {

/// What a request's head may hold.
struct HeadLimits {
    size_t maxHeadBytes = 16 * 1024;  ///< the request line and every header, with their line ends
    size_t maxHeaders = 64;
};

/// A request's line and headers, as the gate read them (names as sent, values trimmed).
struct RequestHead {
    std::string method;
    std::string target;  ///< "/events?from=3"
    std::string version;
    std::vector<std::pair<std::string, std::string>> headers;

    /// The first header named `name` (any case), or null.
    const std::string* header(std::string_view name) const;
    /// The target before any "?".
    std::string_view path() const;
    /// The value of `key` in the query ("?a=1&token=…"), as sent (not percent-decoded).
    std::optional<std::string_view> param(std::string_view key) const;
};

/// Why a request is refused: its HTTP status and a message for the client ({"error": …}).
struct Refusal {
    int status = 400;
    std::string message;
};

/// Reads a request's head: "METHOD TARGET HTTP/1.x" and "Name: value" lines, each ended by
/// CRLF, `head` ending at the empty line (included). A refusal says what is wrong.
tl::expected<RequestHead, Refusal> parseRequestHead(std::string_view head, const HeadLimits& limits);

/// Whether `a` and `b` are the same but for ASCII case (header names, "100-continue").
bool equalsIgnoringCase(std::string_view a, std::string_view b);

}  // namespace batchpilot::app
