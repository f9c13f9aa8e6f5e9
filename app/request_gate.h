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

#include "app/request_head.h"
#include "app/serve_address.h"

namespace httplib {
class Stream;
}

namespace batchpilot::app {

/// The limits of one gate; the defaults are what `--serve` uses.
struct GateLimits : HeadLimits {
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
