#pragma once

// The front of `--serve`: it owns the listening socket and every connection, reads each request
// whole, within limits, before any handler sees it, and hands whole requests to a fixed pool of
// workers. What it protects against is what a client can send before its token is checked:
//
//   - memory: a request's head is at most kMaxHeadBytes in kMaxHeaders lines, its body at most
//     kMaxBodyBytes, given by a Content-Length (a chunked or compressed body is refused, never
//     read or inflated), and a body is read only once the head's token was accepted;
//   - threads: connections are read by one thread with poll(), however many and however slow;
//     answers come from a fixed pool (short requests) and a fixed set of event-stream workers,
//     and a request they cannot take is refused (503), never queued without bound;
//   - time: a request must arrive whole within a deadline, an idle kept-alive connection is
//     closed, and when the connections are at their limit the oldest that has not sent a whole
//     request makes room for the new one, so slow clients cannot lock out a quick one;
//   - signals: every write is MSG_NOSIGNAL, so a client that goes away raises no SIGPIPE.
//
// Parsing and routing stay cpp-httplib's (httplib::Server::process_request on a stream that
// holds the request already read): this file decides only what gets that far.

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tl/expected.hpp>

namespace httplib {
class Stream;
}

namespace batchpilot::app {

/// The limits of one gate; the defaults are what `--serve` uses.
struct GateLimits {
    size_t maxHeadBytes = 16 * 1024;  ///< the request line and every header, with their line ends
    size_t maxHeaders = 64;
    size_t maxBodyBytes = 64 * 1024;
    int maxConnections = 512;  ///< open at once (fewer where the process's file limit is lower)
    int maxPerClient = 256;    ///< open at once from one address
    std::chrono::milliseconds requestDeadline{10'000};  ///< a whole request arrives within it
    std::chrono::milliseconds idleLimit{5'000};         ///< a kept-alive connection waits this long for the next
    int workers = 4;                                    ///< answer short requests
    size_t maxQueued = 64;                              ///< whole requests waiting for a worker
    int streamWorkers = 16;                             ///< event streams served at once
    std::chrono::milliseconds writeLimit{5'000};        ///< a client that takes nothing this long is dropped
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
tl::expected<RequestHead, Refusal> parseRequestHead(std::string_view head, const GateLimits& limits);

/// Where a gate listens: a numeric address, as resolveServeHost gives it.
struct ListenAddress {
    sockaddr_storage address{};
    socklen_t length = 0;
};

/// Resolves `host` (a name or a numeric address) to the address to listen on. Unless
/// `anyAddressAllowed`, every address it resolves to must be a loopback one (127.0.0.0/8, ::1,
/// or ::ffff:127.x): the check reads the address, never the name.
tl::expected<ListenAddress, std::string> resolveServeHost(const std::string& host, int port, bool anyAddressAllowed);
/// Whether `address` is a loopback address (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104).
bool isLoopbackAddress(const sockaddr_storage& address);

class RequestGate {
public:
    struct Handlers {
        /// Called on the gate's thread once a head is read, before its body is: a refusal ends
        /// the connection with it. Must not block.
        std::function<std::optional<Refusal>(const RequestHead&)> admit;
        /// Whether the request holds its connection while the run lasts (an event stream): it
        /// goes to the stream workers.
        std::function<bool(const RequestHead&)> holdsConnection;
        /// Called on a worker: answers the one request the stream holds; returns whether the
        /// connection may carry another request.
        std::function<bool(httplib::Stream&)> answer;
    };

    /// Listens on `address`. Fails with a message naming the address (in use, not this machine's).
    static tl::expected<std::unique_ptr<RequestGate>, std::string> open(const ListenAddress& address, GateLimits limits,
                                                                        Handlers handlers);
    /// Stops: every connection is shut down (a stream's write fails at once), the workers joined.
    ~RequestGate();
    RequestGate(const RequestGate&) = delete;
    RequestGate& operator=(const RequestGate&) = delete;

    int port() const;
    /// The listening socket (valid while the gate lives).
    int listeningSocket() const;

private:
    struct Impl;
    explicit RequestGate(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
};

}  // namespace batchpilot::app
