#include "app/request_gate.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace batchpilot::app {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kLinger = std::chrono::seconds(1);  ///< a refused connection is read and dropped this long
constexpr int kAcceptsPerWake = 256;
constexpr int kListenBacklog =
    4096;  ///< a flood's connections wait here rather than their SYNs being dropped (1 s each)

/// The status line's words for the statuses the gate itself answers.
const char* reason(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

std::string refusalText(const Refusal& refusal) {
    const std::string body =
        nlohmann::json{{"error", refusal.message}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
        "\n";
    return "HTTP/1.1 " + std::to_string(refusal.status) + " " + reason(refusal.status) +
           "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body;
}

/// One whole request, read already, on a connection the gate still owns. Every write is
/// MSG_NOSIGNAL and waits at most the write limit for the client to take it.
class HeldRequest final : public httplib::Stream {
public:
    HeldRequest(int fd, std::string request, std::string peer, int port, std::chrono::milliseconds writeLimit)
        : m_fd(fd), m_request(std::move(request)), m_peer(std::move(peer)), m_port(port), m_writeLimit(writeLimit) {}

    bool is_readable() const override { return m_read < m_request.size(); }
    bool is_writable() const override { return waitWritable(); }
    ssize_t read(char* ptr, size_t size) override {
        const size_t n = std::min(size, m_request.size() - m_read);
        std::memcpy(ptr, m_request.data() + m_read, n);
        m_read += n;
        return static_cast<ssize_t>(n);
    }
    ssize_t write(const char* ptr, size_t size) override {
        size_t sent = 0;
        while (sent < size) {
            const ssize_t n = ::send(m_fd, ptr + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                sent += static_cast<size_t>(n);
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                if (!waitWritable()) return -1;
            } else {
                return -1;
            }
        }
        return static_cast<ssize_t>(size);
    }
    void get_remote_ip_and_port(std::string& ip, int& port) const override {
        ip = m_peer;
        port = m_port;
    }
    void get_local_ip_and_port(std::string& ip, int& port) const override {
        sockaddr_storage address{};
        socklen_t length = sizeof address;
        if (::getsockname(m_fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return;
        std::tie(ip, port) = numericName(address, length);
    }
    socket_t socket() const override { return m_fd; }

private:
    bool waitWritable() const {
        pollfd p{m_fd, POLLOUT, 0};
        int ready = 0;
        do {
            ready = ::poll(&p, 1, static_cast<int>(m_writeLimit.count()));
        } while (ready < 0 && errno == EINTR);
        return ready == 1 && (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
    }

    int m_fd;
    std::string m_request;
    size_t m_read = 0;
    std::string m_peer;
    int m_port;
    std::chrono::milliseconds m_writeLimit;
};

struct Job {
    int fd = -1;
    std::string request;
    std::string peer;
    int port = 0;
};

/// A fixed number of threads taking jobs from a bounded queue.
class WorkerPool {
public:
    using Run = std::function<void(Job&)>;
    WorkerPool(int threads, size_t maxQueued, Run run) : m_maxQueued(maxQueued), m_run(std::move(run)) {
        for (int i = 0; i < threads; ++i) m_threads.emplace_back([this] { work(); });
    }
    ~WorkerPool() {
        {
            const std::lock_guard lock(m_mutex);
            m_stopping = true;
        }
        m_changed.notify_all();
        for (std::thread& thread : m_threads) thread.join();
    }
    /// False when every worker is busy and the queue is full: the caller refuses the request.
    bool offer(Job job) {
        {
            const std::lock_guard lock(m_mutex);
            if (m_queue.size() >= m_idle + m_maxQueued) return false;
            m_queue.push_back(std::move(job));
        }
        m_changed.notify_one();
        return true;
    }

private:
    void work() {
        std::unique_lock lock(m_mutex);
        for (;;) {
            ++m_idle;
            m_changed.wait(lock, [this] { return m_stopping || !m_queue.empty(); });
            --m_idle;
            if (m_queue.empty()) return;  // stopping, nothing left
            Job job = std::move(m_queue.front());
            m_queue.pop_front();
            lock.unlock();
            m_run(job);
            lock.lock();
        }
    }

    std::mutex m_mutex;
    std::condition_variable m_changed;
    std::deque<Job> m_queue;
    size_t m_idle = 0;
    size_t m_maxQueued;
    bool m_stopping = false;
    Run m_run;
    std::vector<std::thread> m_threads;
};

}  // namespace

struct RequestGate::Impl {
    GateLimits limits;
    Handlers handlers;
    int listenFd = -1;
    int wakeFd = -1;
    int port = 0;

    enum class State { Reading, Busy, Closing };
    struct Connection {
        std::string peer;
        int peerPort = 0;
        std::string buffer;
        size_t need = 0;  ///< head and body's length once the head is read
        Clock::time_point since;
        bool answered = false;         ///< a request was answered on it (an idle one waits idleLimit)
        bool holdsConnection = false;  ///< the request read is an event stream's
        State state = State::Reading;
    };
    std::map<int, Connection> connections;  // by socket; the gate thread's alone
    std::map<std::string, int> perClient;
    Clock::time_point acceptPausedUntil{};

    std::mutex mutex;                            // guards returned and stopping
    std::vector<std::pair<int, bool>> returned;  ///< (socket, may carry another request) from the workers
    std::atomic<bool> stopping{false};

    std::unique_ptr<WorkerPool> shortWork;
    std::unique_ptr<WorkerPool> streamWork;
    std::thread gate;

    ~Impl() {
        if (listenFd >= 0) ::close(listenFd);
        if (wakeFd >= 0) ::close(wakeFd);
    }

    void wake() {
        const uint64_t one = 1;
        (void)!::write(wakeFd, &one, sizeof one);
    }

    /// Runs on a worker: answers, then gives the connection back to the gate.
    void serve(Job& job) {
        bool again = false;
        if (!stopping) {
            HeldRequest stream(job.fd, std::move(job.request), job.peer, job.port, limits.writeLimit);
            try {
                again = handlers.answer(stream);
            } catch (const std::exception&) {
                again = false;  // httplib answers a handler's exception itself; this is its own failure
            }
        }
        {
            const std::lock_guard lock(mutex);
            returned.emplace_back(job.fd, again);
        }
        wake();
    }

    void close(int fd) {
        const auto it = connections.find(fd);
        if (it == connections.end()) return;
        if (const auto client = perClient.find(it->second.peer); client != perClient.end() && --client->second <= 0)
            perClient.erase(client);
        connections.erase(it);
        ::close(fd);
    }

    /// Answers `refusal` and closes the connection after reading (and dropping) what the client
    /// still sends for a moment: closing with unread bytes would reset the connection and could
    /// destroy the answer before the client reads it.
    void refuse(int fd, Connection& connection, const Refusal& refusal) {
        const std::string text = refusalText(refusal);
        (void)!::send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        ::shutdown(fd, SHUT_WR);
        connection.buffer.clear();
        connection.buffer.shrink_to_fit();
        connection.state = State::Closing;
        connection.since = Clock::now();
        // A client that has sent all it will (a flood of one-shot requests) is closed at the next
        // turn instead of lingering: thousands of them a second would otherwise fill the table.
        char chunk[16 * 1024];
        for (int i = 0; i < 4; ++i) {
            const ssize_t n = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
            if (n > 0) continue;
            if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                connection.since -= kLinger;  // expire() closes it
            break;
        }
    }

    /// Makes room for a connection from `peer`: the oldest connection that has not sent a whole
    /// request (of that peer only, when `peer` is given) is closed. False when none can go.
    bool evictOldest(const std::string* peer) {
        int oldest = -1;
        std::pair<bool, Clock::time_point> oldestKey{};
        for (const auto& [fd, c] : connections) {
            if (c.state == State::Busy || (peer != nullptr && c.peer != *peer)) continue;
            // Closing first, then never answered, then idle kept-alive; oldest first within each.
            const std::pair<bool, Clock::time_point> key{c.state != State::Closing && c.answered, c.since};
            if (oldest < 0 || key < oldestKey) {
                oldest = fd;
                oldestKey = key;
            }
        }
        if (oldest < 0) return false;
        close(oldest);
        return true;
    }

    void accept() {
        for (int i = 0; i < kAcceptsPerWake; ++i) {
            sockaddr_storage address{};
            socklen_t length = sizeof address;
            const int fd =
                ::accept4(listenFd, reinterpret_cast<sockaddr*>(&address), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR || errno == ECONNABORTED) continue;
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                    // Out of sockets: make room, or wait a moment rather than spin on the backlog.
                    if (!evictOldest(nullptr)) acceptPausedUntil = Clock::now() + std::chrono::milliseconds(100);
                }
                return;
            }
            auto [peer, peerPort] = numericName(address, length);
            const char* full = nullptr;
            if (static_cast<int>(connections.size()) >= limits.maxConnections && !evictOldest(nullptr))
                full = "the server has as many connections as it takes: try again in a moment";
            else if (const auto held = perClient.find(peer);
                     held != perClient.end() && held->second >= limits.maxPerClient && !evictOldest(&peer))
                full = "this address has as many connections as one client may hold: close some and try again";
            if (full != nullptr) {
                const std::string text = refusalText({503, full});
                (void)!::send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
                ::close(fd);
                continue;
            }
            ++perClient[peer];
            Connection& connection = connections[fd];
            connection.peer = std::move(peer);
            connection.peerPort = peerPort;
            connection.since = Clock::now();
            read(fd, connection);  // a request usually arrives with its connection: no turn waited
        }
    }

    /// Reads what the connection has, and once a request is whole hands it to a worker.
    void read(int fd, Connection& c) {
        char chunk[16 * 1024];
        if (c.state == State::Closing) {
            ssize_t n = 0;
            do {
                n = ::recv(fd, chunk, sizeof chunk, 0);
            } while (n < 0 && errno == EINTR);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) close(fd);
            return;
        }
        // Never more than the head's limit, or than the request's declared end: a pipelined
        // next request stays in the kernel until this one is answered.
        const size_t bound = c.need > 0 ? c.need : limits.maxHeadBytes;
        if (c.buffer.size() >= bound) return;
        const size_t window = bound - c.buffer.size();
        ssize_t n = 0;
        do {
            n = ::recv(fd, chunk, std::min(window, sizeof chunk), 0);
        } while (n < 0 && errno == EINTR);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return close(fd);
        if (n < 0) return;
        if (c.buffer.empty() && c.answered) c.since = Clock::now();  // the next request's clock starts
        c.buffer.append(chunk, static_cast<size_t>(n));
        advance(fd, c);
    }

    /// Parses what the connection holds: a refusal, more to wait for, or a whole request handed
    /// to a worker (bytes after it, a pipelined request's, stay for when it is answered).
    void advance(int fd, Connection& c) {
        if (c.need == 0) {
            const size_t end = c.buffer.find("\r\n\r\n");
            if (end == std::string::npos) {
                if (c.buffer.size() >= limits.maxHeadBytes)
                    refuse(fd, c,
                           {431, "the request's headers are over " + std::to_string(limits.maxHeadBytes) +
                                     " bytes: send fewer or shorter headers"});
                return;
            }
            const size_t headLength = end + 4;
            auto head = parseRequestHead(std::string_view(c.buffer).substr(0, headLength), limits);
            if (!head) return refuse(fd, c, head.error());
            auto length = bodyLength(*head);
            if (!length) return refuse(fd, c, length.error());
            if (handlers.admit) {
                if (auto refusal = handlers.admit(*head)) return refuse(fd, c, *refusal);
            }
            c.need = headLength + *length;
            c.holdsConnection = handlers.holdsConnection && handlers.holdsConnection(*head);
            // A client that asks first (curl, for a body over 1 KiB) would wait a second for this.
            if (const std::string* expect = head->header("Expect");
                expect && equalsIgnoringCase(*expect, "100-continue") && c.buffer.size() < c.need) {
                static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
                (void)!::send(fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            }
        }
        if (c.buffer.size() >= c.need) dispatch(fd, c);
    }

    tl::expected<size_t, Refusal> bodyLength(const RequestHead& head) const {
        const std::string limit = std::to_string(limits.maxBodyBytes);
        size_t length = 0;
        bool declared = false;
        for (const auto& [name, value] : head.headers) {
            if (equalsIgnoringCase(name, "Transfer-Encoding"))
                return tl::unexpected(
                    Refusal{411, "send the body with a Content-Length (at most " + limit + " bytes), not in chunks"});
            if (equalsIgnoringCase(name, "Content-Encoding") && !equalsIgnoringCase(value, "identity"))
                return tl::unexpected(
                    Refusal{415, "a compressed body (Content-Encoding: " + value + ") is not taken: send it plain"});
            if (!equalsIgnoringCase(name, "Content-Length")) continue;
            if (value.empty() || value.size() > 19 ||
                !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
                return tl::unexpected(Refusal{400, "Content-Length: a whole number of bytes, got \"" + value + "\""});
            const size_t n = std::stoull(value);
            if (declared && n != length) return tl::unexpected(Refusal{400, "two different Content-Length headers"});
            if (n > limits.maxBodyBytes)
                return tl::unexpected(
                    Refusal{413, "the body is " + value + " bytes; a request's body is at most " + limit + " bytes"});
            length = n;
            declared = true;
        }
        return length;
    }

    void dispatch(int fd, Connection& c) {
        Job job{fd, c.buffer.substr(0, c.need), c.peer, c.peerPort};
        c.buffer.erase(0, c.need);
        c.need = 0;
        c.state = State::Busy;
        if ((c.holdsConnection ? streamWork : shortWork)->offer(std::move(job))) return;
        c.state = State::Reading;
        refuse(fd, c,
               c.holdsConnection ? Refusal{503, "the server streams to " + std::to_string(limits.streamWorkers) +
                                                    " clients already: close a window or a stream and try again"}
                                 : Refusal{503, "the server is busy: try again in a moment"});
    }

    void takeReturned() {
        std::vector<std::pair<int, bool>> back;
        {
            const std::lock_guard lock(mutex);
            back.swap(returned);
        }
        for (const auto& [fd, again] : back) {
            const auto it = connections.find(fd);
            if (it == connections.end()) continue;
            if (!again || stopping) {
                close(fd);
                continue;
            }
            it->second.state = State::Reading;
            it->second.answered = true;
            it->second.since = Clock::now();
            if (!it->second.buffer.empty()) advance(fd, it->second);
        }
    }

    /// Closes what is past its time; returns how long until the next deadline.
    std::chrono::milliseconds expire() {
        const auto now = Clock::now();
        auto next = limits.idleLimit;
        std::vector<int> late;
        for (const auto& [fd, c] : connections) {
            if (c.state == State::Busy) continue;
            const auto limit = c.state == State::Closing          ? std::chrono::milliseconds(kLinger)
                               : (c.answered && c.buffer.empty()) ? limits.idleLimit
                                                                  : limits.requestDeadline;
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.since + limit - now);
            if (left.count() <= 0)
                late.push_back(fd);
            else
                next = std::min(next, left);
        }
        for (const int fd : late) close(fd);
        return std::max(next, std::chrono::milliseconds(5));
    }

    void run() {
        std::vector<pollfd> polled;
        std::vector<int> order;
        while (!stopping) {
            takeReturned();
            const auto timeout = expire();
            polled.clear();
            const bool accepting = Clock::now() >= acceptPausedUntil;
            polled.push_back({wakeFd, POLLIN, 0});
            polled.push_back({accepting ? listenFd : -1, POLLIN, 0});
            for (const auto& [fd, c] : connections)
                if (c.state != State::Busy) polled.push_back({fd, POLLIN, 0});
            const int timeoutMs =
                accepting ? static_cast<int>(timeout.count()) : std::min(static_cast<int>(timeout.count()), 100);
            if (::poll(polled.data(), polled.size(), timeoutMs) < 0 && errno != EINTR) break;
            if (polled[0].revents & POLLIN) {
                uint64_t count = 0;
                (void)!::read(wakeFd, &count, sizeof count);
            }
            for (size_t i = 2; i < polled.size(); ++i) {
                if (polled[i].revents == 0) continue;
                const auto it = connections.find(polled[i].fd);
                if (it != connections.end() && it->second.state != State::Busy) read(polled[i].fd, it->second);
            }
            if (polled[1].revents & POLLIN) accept();
        }
        // Stopping: a worker writing to a connection fails at once; the sockets are closed once
        // the workers are joined (never while one might still write to the number).
        for (const auto& [fd, c] : connections) ::shutdown(fd, SHUT_RDWR);
    }
};

RequestGate::RequestGate(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}

tl::expected<std::unique_ptr<RequestGate>, std::string> RequestGate::open(const ListenAddress& address,
                                                                          GateLimits limits, Handlers handlers) {
    auto impl = std::make_unique<Impl>();
    // Each connection is a socket: stay well inside the process's file limit.
    if (rlimit files{}; ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
        const auto room = static_cast<int>(std::min<rlim_t>(files.rlim_cur, 1 << 20)) - 128;
        limits.maxConnections = std::max(16, std::min(limits.maxConnections, room));
        limits.maxPerClient = std::min(limits.maxPerClient, limits.maxConnections);
    }
    impl->limits = limits;
    impl->handlers = std::move(handlers);
    const std::string where = numericName(address.address, address.length).first;
    impl->listenFd = ::socket(address.address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (impl->listenFd < 0)
        return tl::unexpected("--serve: cannot make a socket: " + std::string(std::strerror(errno)));
    const int yes = 1;
    ::setsockopt(impl->listenFd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(impl->listenFd, reinterpret_cast<const sockaddr*>(&address.address), address.length) != 0 ||
        ::listen(impl->listenFd, kListenBacklog) != 0) {
        const int error = errno;
        const int port = static_cast<int>(ntohs(address.address.ss_family == AF_INET6
                                                    ? reinterpret_cast<const sockaddr_in6&>(address.address).sin6_port
                                                    : reinterpret_cast<const sockaddr_in&>(address.address).sin_port));
        return tl::unexpected("--serve: cannot listen on " + where + ":" + std::to_string(port) + " (" +
                              std::strerror(error) +
                              "): the port may be in use by another program, or the address not this machine's; "
                              "choose another port, or 0 for any free one");
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    ::getsockname(impl->listenFd, reinterpret_cast<sockaddr*>(&bound), &length);
    impl->port = numericName(bound, length).second;
    impl->wakeFd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (impl->wakeFd < 0)
        return tl::unexpected("--serve: cannot make an eventfd: " + std::string(std::strerror(errno)));
    Impl& gate = *impl;
    try {
        gate.shortWork =
            std::make_unique<WorkerPool>(limits.workers, limits.maxQueued, [&gate](Job& job) { gate.serve(job); });
        gate.streamWork =
            std::make_unique<WorkerPool>(limits.streamWorkers, /*maxQueued=*/0, [&gate](Job& job) { gate.serve(job); });
        gate.gate = std::thread([&gate] { gate.run(); });
    } catch (const std::system_error& e) {
        gate.stopping = true;
        gate.shortWork.reset();
        gate.streamWork.reset();
        return tl::unexpected("--serve: cannot start the server's threads (" + std::string(e.what()) +
                              "): the process is at its limit of threads or memory");
    }
    return std::unique_ptr<RequestGate>(new RequestGate(std::move(impl)));
}

RequestGate::~RequestGate() {
    m_impl->stopping = true;
    m_impl->wake();
    if (m_impl->gate.joinable()) m_impl->gate.join();
    m_impl->shortWork.reset();
    m_impl->streamWork.reset();
    for (const auto& [fd, c] : m_impl->connections) ::close(fd);
    m_impl->connections.clear();
}

int RequestGate::port() const {
    return m_impl->port;
}

int RequestGate::listeningSocket() const {
    return m_impl->listenFd;
}

}  // namespace batchpilot::app
