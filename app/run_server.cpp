#include "app/run_server.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/config/option_schema.h"
#include "core/events/event_json.h"
#include "core/train/trainer.h"

namespace batchpilot::app {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxBodyBytes = 64 * 1024;
constexpr int kMaxConnections = 512;        ///< served at once (a thread each); more wait in the listen backlog
constexpr double kRequestsPerSecond = 100;  ///< per client address, with bursts of kBurst
constexpr double kBurst = 200;
constexpr auto kKeepAlive = std::chrono::seconds(15);  ///< a comment on a quiet stream
constexpr size_t kEventsPerWrite = 2048;
constexpr auto kStreamTick = std::chrono::milliseconds(50);  ///< a live stream's latency, at most
constexpr auto kRequestDeadline = std::chrono::seconds(10);  ///< a whole request must arrive within it
constexpr int kListenBacklog = 512;                          ///< connections the kernel queues (httplib's own is 5)

int portOf(const sockaddr_storage& address) {
    if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
    if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
    return -1;
}

/// A connection's peer as httplib names it in Request::remote_addr/remote_port ("127.0.0.1:53211").
std::string peerOf(int fd) {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return {};
    char host[NI_MAXHOST];
    char port[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&address), length, host, sizeof host, port, sizeof port,
                      NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return {};
    return std::string(host) + ":" + port;
}

/// Slow clients ("slowloris": a request sent a byte at a time). httplib's read timeout applies to
/// each read, so a client sending a byte a second would hold a connection — and its thread — for
/// hours. Here every connection must deliver a whole request (headers and body) within
/// kRequestDeadline of being first seen, or of its previous answer; past it the connection is shut
/// down. An event stream, once asked for, is exempt (it only writes).
///
/// httplib hands out no accepted socket, so the connections are found by looking at this
/// process's sockets on the listening port every kDeadlineTick (one look at /proc/self/fd, not
/// one per connection: under a flood of connections that would cost more than the flood). A
/// connection is shut down through a duplicate taken and checked (same socket, same peer) at that
/// moment, so a number closed and reused meanwhile is never touched.
class RequestDeadlines {
public:
    RequestDeadlines() : m_watch([this] { watch(); }) {}
    ~RequestDeadlines() {
        {
            const std::lock_guard lock(m_mutex);
            m_stopping = true;
        }
        m_changed.notify_all();
        m_watch.join();
    }

    /// The listening socket, once bound: connections on its port are watched from then on.
    void watchPort(int listenSocket) {
        sockaddr_storage own{};
        socklen_t length = sizeof own;
        struct stat info {};
        if (::getsockname(listenSocket, reinterpret_cast<sockaddr*>(&own), &length) != 0 ||
            ::fstat(listenSocket, &info) != 0)
            return;
        const std::lock_guard lock(m_mutex);
        m_family = own.ss_family;
        m_port = portOf(own);
        m_listenInode = info.st_ino;
    }
    /// The server stops: every connection still open is shut down at once (a slow or idle client
    /// must not hold the run's exit), streams included.
    void cutAll() {
        {
            const std::lock_guard lock(m_mutex);
            m_cutAll = true;
        }
        m_changed.notify_all();
    }
    /// The answer is about to be written: the next request on the connection has its own deadline.
    void answered(const std::string& peer) {
        const std::lock_guard lock(m_mutex);
        Mark& mark = m_marks[peer];
        mark.answered = mark.touched = Clock::now();
    }
    /// The connection streams events: never cut.
    void streaming(const std::string& peer) {
        const std::lock_guard lock(m_mutex);
        Mark& mark = m_marks[peer];
        mark.streaming = true;
        mark.touched = Clock::now();
    }

private:
    static constexpr auto kDeadlineTick = std::chrono::milliseconds(250);
    struct Seen {
        std::string peer;
        Clock::time_point since;
    };
    struct Mark {
        Clock::time_point answered{};
        Clock::time_point touched{};
        bool streaming = false;
    };

    void watch() {
        std::unique_lock lock(m_mutex);
        bool cutting = false;  // cutAll() seen: look every 50 ms
        while (!m_stopping) {
            m_changed.wait_for(lock, cutting ? kDeadlineTick / 5 : kDeadlineTick,
                               [&] { return m_stopping || m_cutAll != cutting; });
            if (m_stopping) break;
            cutting = m_cutAll;
            if (m_port < 0) continue;
            lock.unlock();
            look();
            lock.lock();
        }
    }

    /// One look at the process's sockets: new connections start their clock, gone ones are
    /// forgotten, and those past their deadline are shut down.
    void look() {
        int family = 0, port = 0;
        ino_t listening = 0;
        bool cutAll = false;
        {
            const std::lock_guard lock(m_mutex);
            family = m_family;
            port = m_port;
            listening = m_listenInode;
            cutAll = m_cutAll;
        }
        std::vector<std::pair<int, ino_t>> sockets;  // (number, inode) of every socket but the listening one
        if (DIR* dir = ::opendir("/proc/self/fd")) {
            while (const dirent* entry = ::readdir(dir)) {
                char* end = nullptr;
                const long fd = std::strtol(entry->d_name, &end, 10);
                struct stat info {};
                if (end == entry->d_name || *end != '\0' || fd == ::dirfd(dir) ||
                    ::fstat(static_cast<int>(fd), &info) != 0 || !S_ISSOCK(info.st_mode) || info.st_ino == listening)
                    continue;
                sockets.emplace_back(static_cast<int>(fd), info.st_ino);
            }
            ::closedir(dir);
        }
        const auto now = Clock::now();
        std::map<ino_t, Seen> seen;
        struct Late {
            int fd;
            ino_t inode;
            std::string peer;
        };
        std::vector<Late> late;
        {
            const std::lock_guard lock(m_mutex);
            for (const auto& [fd, inode] : sockets) {
                if (const auto known = m_seen.find(inode); known != m_seen.end()) {
                    seen.insert(*known);
                    continue;
                }
                sockaddr_storage local{};
                socklen_t length = sizeof local;
                if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0 || local.ss_family != family ||
                    portOf(local) != port)
                    continue;  // another socket of this process (a rank's connection, …)
                if (std::string peer = peerOf(fd); !peer.empty()) seen[inode] = Seen{std::move(peer), now};
            }
            m_seen = std::move(seen);
            std::set<std::string> peers;
            for (const auto& [fd, inode] : sockets) {
                const auto it = m_seen.find(inode);
                if (it == m_seen.end()) continue;
                peers.insert(it->second.peer);
                const auto mark = m_marks.find(it->second.peer);
                if (!cutAll && mark != m_marks.end() && mark->second.streaming) continue;
                const auto from =
                    mark == m_marks.end() ? it->second.since : std::max(it->second.since, mark->second.answered);
                if (cutAll || now - from >= kRequestDeadline) late.push_back(Late{fd, inode, it->second.peer});
            }
            // Marks of connections that are gone (kept a while: a connection may be marked
            // before a look first sees it).
            std::erase_if(m_marks, [&](const auto& entry) {
                return peers.count(entry.first) == 0 && now - entry.second.touched > std::chrono::seconds(5);
            });
        }
        for (const Late& connection : late) {
            const int copy = ::fcntl(connection.fd, F_DUPFD_CLOEXEC, 0);
            if (copy < 0) continue;
            struct stat info {};
            if (::fstat(copy, &info) == 0 && info.st_ino == connection.inode && peerOf(copy) == connection.peer)
                ::shutdown(copy, SHUT_RDWR);  // httplib's read fails; the connection ends
            ::close(copy);
        }
    }

    std::mutex m_mutex;
    std::condition_variable m_changed;
    int m_family = 0;
    int m_port = -1;  ///< the listening port; -1 before it is bound
    ino_t m_listenInode = 0;
    bool m_cutAll = false;
    std::map<ino_t, Seen> m_seen;         ///< connections on the port, by socket inode
    std::map<std::string, Mark> m_marks;  ///< by peer ("127.0.0.1:53211")
    bool m_stopping = false;
    std::thread m_watch;
};

/// One thread per connection, at most kMaxConnections at once: a stream held open by a window
/// never waits behind another, and a flood of connections waits in the kernel's listen backlog
/// (enqueue blocks the accept loop) instead of in memory. Idle connections end after the read
/// timeout.
class ConnectionThreads final : public httplib::TaskQueue {
public:
    void enqueue(std::function<void()> fn) override {
        std::unique_lock lock(m_mutex);
        m_changed.wait(lock, [this] { return m_active < kMaxConnections || m_stopping; });
        if (m_stopping) return;  // the server is stopping; the socket closes with the process
        ++m_active;
        std::thread([this, fn = std::move(fn)] {
            fn();
            const std::lock_guard done(m_mutex);
            --m_active;
            m_changed.notify_all();
        }).detach();
    }
    void shutdown() override {
        std::unique_lock lock(m_mutex);
        m_stopping = true;
        m_changed.notify_all();
        m_changed.wait(lock, [this] { return m_active == 0; });
    }

private:
    std::mutex m_mutex;
    std::condition_variable m_changed;
    int m_active = 0;
    bool m_stopping = false;
};

std::string peerOf(const httplib::Request& req) {
    return req.remote_addr + ":" + std::to_string(req.remote_port);
}

void reply(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", "application/json");
}

void refuse(httplib::Response& res, int status, const std::string& message) {
    reply(res, status, {{"error", message}});
}

/// The value of `key` in the body, read by the option's own rule (the command line's message).
tl::expected<core::TrainerOptions, std::string> readAsOption(const json& body, const char* key) {
    core::TrainerOptions scratch;
    const core::OptionSpec* spec = core::findOption(key);
    if (spec == nullptr) return tl::unexpected(std::string("unknown option ") + key);
    const auto value = body.find(key);
    if (value == body.end()) return tl::unexpected(std::string("\"") + key + "\" is missing");
    core::OptionReading reading;
    if (auto read = core::readOption(*spec, *value, key, scratch, reading); !read) return tl::unexpected(read.error());
    return scratch;
}

}  // namespace

bool isLoopback(const std::string& host) {
    return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

tl::expected<ServeAddress, std::string> parseServeAddress(const std::string& text, bool anyAddressAllowed) {
    ServeAddress address;
    std::string port = text;
    if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
        address.host = text.substr(0, colon);
        port = text.substr(colon + 1);
        if (address.host.size() >= 2 && address.host.front() == '[' && address.host.back() == ']')
            address.host = address.host.substr(1, address.host.size() - 2);
        if (address.host.empty())
            return tl::unexpected("--serve: no address before \":\" in \"" + text + "\": give PORT or ADDR:PORT");
    }
    char* end = nullptr;
    errno = 0;
    const long number = port.empty() ? -1 : std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || errno != 0 || number < 0 || number > 65535)
        return tl::unexpected("--serve: the port must be a whole number from 0 to 65535 (0: any free one), got \"" +
                              port + "\"");
    address.port = static_cast<int>(number);
    if (!isLoopback(address.host) && !anyAddressAllowed) {
        return tl::unexpected(
            "--serve " + text +
            ": serving on an address other than loopback lets anyone who can reach it watch the run, and with the "
            "control token steer it; the token is its only protection and travels unencrypted. Serve on loopback "
            "(--serve PORT) and reach it through an SSH tunnel (ssh -L PORT:localhost:PORT SERVER), or add "
            "--serve-any-address to accept the risk");
    }
    return address;
}

std::string randomToken() {
    unsigned char bytes[16];
    size_t got = 0;
    while (got < sizeof bytes) {
        const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw std::runtime_error(std::string("the OS's random source failed: ") + std::strerror(errno));
        }
        got += static_cast<size_t>(n);
    }
    static const char* const kHex = "0123456789abcdef";
    std::string token;
    for (unsigned char b : bytes) {
        token += kHex[b >> 4];
        token += kHex[b & 15];
    }
    return token;
}

bool sameToken(const std::string& a, const std::string& b) {
    if (a.size() != b.size() || a.empty()) return false;
    unsigned char difference = 0;
    for (size_t i = 0; i < a.size(); ++i)
        difference |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
    return difference == 0;
}

tl::expected<RemoteCommand, std::string> parseRemoteCommand(const std::string& body) {
    const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return tl::unexpected(std::string("the body is not a JSON object: send {\"command\": ...}"));
    const auto name = j.find("command");
    if (name == j.end() || !name->is_string())
        return tl::unexpected(
            std::string("\"command\" is missing: one of pause, resume, stop, reprobe, target_batch, "
                        "device, memory_savers, check_equivalence"));
    const std::string& text = name->get_ref<const std::string&>();
    RemoteCommand command;
    using Kind = RemoteCommand::Kind;
    if (text == "pause") {
        command.kind = Kind::Pause;
    } else if (text == "resume") {
        command.kind = Kind::Resume;
    } else if (text == "stop") {
        command.kind = Kind::Stop;
    } else if (text == "reprobe") {
        command.kind = Kind::Reprobe;
    } else if (text == "target_batch") {
        command.kind = Kind::TargetBatch;
        auto read = readAsOption(j, "target_batch");
        if (!read) return tl::unexpected(read.error());
        command.targetBatch = read->targetBatch;
        if (j.contains("lr_scaling")) {
            auto rule = readAsOption(j, "lr_scaling");
            if (!rule) return tl::unexpected(rule.error());
            command.lrScaling = rule->lrScaling;
        }
    } else if (text == "device") {
        command.kind = Kind::Device;
        auto read = readAsOption(j, "device");
        if (!read) return tl::unexpected(read.error());
        command.device = read->device;
        if (const auto rank = j.find("rank"); rank != j.end()) {
            if (!rank->is_number_integer() || rank->get<int64_t>() < 0 || rank->get<int64_t>() > 4096)
                return tl::unexpected(std::string("\"rank\": a whole number from 0 (the rank that moves)"));
            command.rank = static_cast<int>(rank->get<int64_t>());
        }
    } else if (text == "memory_savers") {
        command.kind = Kind::MemorySavers;
        auto read = readAsOption(j, "memory_savers");
        if (!read) return tl::unexpected(read.error());
        command.savers = read->memorySavers;
    } else if (text == "check_equivalence") {
        command.kind = Kind::CheckEquivalence;
        if (const auto samples = j.find("samples"); samples != j.end()) {
            if (!samples->is_number_integer() || samples->get<int64_t>() < 0)
                return tl::unexpected(
                    std::string("\"samples\": a whole number, 0 for the whole training batch, or more"));
            command.samples = samples->get<int64_t>();
        }
    } else {
        return tl::unexpected("unknown command \"" + text +
                              "\": one of pause, resume, stop, reprobe, target_batch, device, memory_savers, "
                              "check_equivalence");
    }
    return command;
}

std::string describe(const RemoteCommand& command) {
    using Kind = RemoteCommand::Kind;
    switch (command.kind) {
    case Kind::Pause: return "pause";
    case Kind::Resume: return "resume";
    case Kind::Stop: return "stop";
    case Kind::Reprobe: return "re-probe";
    case Kind::TargetBatch: return "target batch -> " + std::to_string(command.targetBatch);
    case Kind::Device: return "device of rank " + std::to_string(command.rank) + " -> " + command.device;
    case Kind::MemorySavers: return std::string("memory savers -> ") + core::toString(command.savers);
    case Kind::CheckEquivalence:
        return "check equivalence" + (command.samples > 0 ? " on " + std::to_string(command.samples) + " samples" : "");
    }
    return "command";
}

struct RunServer::Impl {
    RequestDeadlines deadlines;  // before the server: it outlives every connection
    httplib::Server server;
    int listenSocket = -1;
    std::thread listener;
    std::string host;
    int port = 0;
    std::string controlToken = randomToken();
    std::string watchToken = randomToken();
    std::string runFolder;
    std::string servePath;

    std::mutex mutex;                 // guards everything below
    std::condition_variable changed;  // the run ended, the server stops, or a stream ended
    std::FILE* spool = nullptr;       ///< every event's line, one after the other
    std::vector<int64_t> offsets;     ///< where event i's line starts; offsets.back() is the end
    std::string tail;                 ///< the last lines, not yet in the spool (written in bulk)
    int64_t spooled = 0;              ///< bytes in the spool; the tail starts there
    bool spoolFailed = false;         ///< a full disk: the stream stopped growing, the run goes on
    bool ended = false;
    bool stopping = false;
    int streams = 0;  ///< event streams being served
    core::Trainer* trainer = nullptr;
    std::string configuration = "{}";
    std::function<void(const std::string&)> said;
    struct Bucket {
        double tokens = kBurst;
        Clock::time_point last = Clock::now();
    };
    std::map<std::string, Bucket> buckets;

    enum class Access { None, Watch, Control };
    Access access(const httplib::Request& req) const {
        std::string token;
        const std::string header = req.get_header_value("Authorization");
        if (header.rfind("Bearer ", 0) == 0)
            token = header.substr(7);
        else if (req.has_param("token"))
            token = req.get_param_value("token");
        if (sameToken(token, controlToken)) return Access::Control;
        if (sameToken(token, watchToken)) return Access::Watch;
        return Access::None;
    }

    bool allowRate(const std::string& address) {
        const std::lock_guard lock(mutex);
        if (buckets.size() > 10000) buckets.clear();  // bounded, whatever the addresses
        Bucket& b = buckets[address];
        const auto now = Clock::now();
        b.tokens =
            std::min(kBurst, b.tokens + std::chrono::duration<double>(now - b.last).count() * kRequestsPerSecond);
        b.last = now;
        if (b.tokens < 1) return false;
        b.tokens -= 1;
        return true;
    }

    /// Writes the tail to the spool (under the mutex). On failure the stream ends where the spool
    /// does: the events of the tail are dropped from it, and later ones are not kept.
    void spoolTail() {
        if (tail.empty()) return;
        if (::pwrite(::fileno(spool), tail.data(), tail.size(), spooled) != static_cast<ssize_t>(tail.size())) {
            while (offsets.back() > spooled) offsets.pop_back();
            spoolFailed = true;
        } else {
            spooled += static_cast<int64_t>(tail.size());
        }
        tail.clear();
    }

    /// Lines [first, last) of the spool, as SSE records numbered from first + 1 (fewer when the
    /// spool could not take them).
    std::string records(size_t first, size_t last) {
        if (offsets[last] > spooled) spoolTail();
        last = std::min(last, offsets.size() - 1);
        if (first >= last) return {};
        std::string text;
        const int64_t begin = offsets[first];
        const int64_t end = offsets[last];
        std::string lines(static_cast<size_t>(end - begin), '\0');
        if (::pread(::fileno(spool), lines.data(), lines.size(), begin) != static_cast<ssize_t>(lines.size()))
            return {};
        size_t at = 0;
        for (size_t i = first; i < last; ++i) {
            const size_t length = static_cast<size_t>(offsets[i + 1] - offsets[i]) - 1;  // less its newline
            text += "id: " + std::to_string(i + 1) + "\ndata: ";
            text.append(lines, at, length);
            text += "\n\n";
            at += length + 1;
        }
        return text;
    }

    void routes() {
        server.set_payload_max_length(kMaxBodyBytes);
        server.set_read_timeout(std::chrono::seconds(2));
        server.set_write_timeout(std::chrono::seconds(5));
        server.set_keep_alive_max_count(100);
        server.set_keep_alive_timeout(2);  // an idle connection is closed after 2 s
        server.new_task_queue = [] { return new ConnectionThreads; };
        server.set_socket_options([this](socket_t sock) {
            httplib::default_socket_options(sock);
            listenSocket = sock;  // to raise its backlog once bound
        });
        server.set_post_routing_handler(
            [this](const httplib::Request& req, httplib::Response&) { deadlines.answered(peerOf(req)); });
        server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            if (!allowRate(req.remote_addr)) {
                refuse(res, 429, "more than 100 requests a second from this address: slow down");
                return httplib::Server::HandlerResponse::Handled;
            }
            if (access(req) == Access::None) {
                refuse(res, 401,
                       "a token is needed: the URL batchpilot-cli printed (…/?token=…), or the header "
                       "\"Authorization: Bearer TOKEN\"");
                return httplib::Server::HandlerResponse::Handled;
            }
            return httplib::Server::HandlerResponse::Unhandled;
        });
        server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
            refuse(res, 500, "the server failed to answer this request");
        });
        server.Get("/", [this](const httplib::Request& req, httplib::Response& res) {
            const std::lock_guard lock(mutex);
            reply(res, 200,
                  {{"events", offsets.size() - 1},
                   {"ended", ended},
                   {"access", access(req) == Access::Control ? "control" : "watch"},
                   {"run_folder", runFolder}});
        });
        server.Get("/config", [this](const httplib::Request&, httplib::Response& res) {
            const std::lock_guard lock(mutex);
            res.set_content(configuration, "application/json");
        });
        server.Get("/events", [this](const httplib::Request& req, httplib::Response& res) {
            size_t next = 0;  // index of the next event to send
            const auto number = [](const std::string& text) -> std::optional<size_t> {
                char* end = nullptr;
                const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
                if (text.empty() || *end != '\0' || text[0] == '-') return std::nullopt;
                return static_cast<size_t>(n);
            };
            if (req.has_header("Last-Event-ID")) {
                const auto last = number(req.get_header_value("Last-Event-ID"));
                if (!last) return refuse(res, 400, "Last-Event-ID: the number of the last event received");
                next = *last;
            } else if (req.has_param("from")) {
                const auto from = number(req.get_param_value("from"));
                if (!from || *from == 0) return refuse(res, 400, "from: the number of the first event wanted (from 1)");
                next = *from - 1;
            }
            res.set_header("Cache-Control", "no-cache");
            deadlines.streaming(peerOf(req));
            {
                const std::lock_guard lock(mutex);
                ++streams;
            }
            res.set_chunked_content_provider(
                "text/event-stream",
                [this, next, quiet = Clock::now()](size_t, httplib::DataSink& sink) mutable {
                    std::string text;
                    bool done = false;
                    {
                        std::unique_lock lock(mutex);
                        // Nothing to send: look again in kStreamTick. The run never wakes a stream
                        // (a wake per event cost a busy run's training thread several percent).
                        if (next + 1 >= offsets.size())
                            changed.wait_for(lock, kStreamTick, [&] { return stopping || ended; });
                        if (stopping) return false;
                        const size_t count = offsets.size() - 1;
                        if (next < count) {
                            const size_t last = std::min(count, next + kEventsPerWrite);
                            text = records(next, last);
                            next = std::min(last, offsets.size() - 1);
                            quiet = Clock::now();
                        } else if (ended) {
                            done = true;
                        } else if (Clock::now() - quiet >= kKeepAlive) {
                            text = ": still running\n\n";  // keeps proxies and the client from timing out
                            quiet = Clock::now();
                        }
                    }
                    if (!text.empty() && !sink.write(text.data(), text.size())) return false;
                    if (done) sink.done();
                    return true;
                },
                [this](bool) {
                    const std::lock_guard lock(mutex);
                    --streams;
                    changed.notify_all();
                });
        });
        server.Post("/command", [this](const httplib::Request& req, httplib::Response& res) {
            if (access(req) != Access::Control)
                return refuse(res, 403, "this token can watch the run, not steer it: use the control token");
            auto command = parseRemoteCommand(req.body);
            if (!command) return refuse(res, 400, command.error());
            std::function<void(const std::string&)> tell;
            {
                const std::lock_guard lock(mutex);
                if (ended) return refuse(res, 409, "the run has ended");
                if (trainer == nullptr) return refuse(res, 503, "the run is starting: try again in a moment");
                using Kind = RemoteCommand::Kind;
                switch (command->kind) {
                case Kind::Pause: trainer->pause(); break;
                case Kind::Resume: trainer->resume(); break;
                case Kind::Stop: trainer->stop(); break;
                case Kind::Reprobe: trainer->reprobe(); break;
                case Kind::TargetBatch: trainer->setTargetBatch(command->targetBatch, command->lrScaling); break;
                case Kind::Device: trainer->switchDevice(command->device, command->rank); break;
                case Kind::MemorySavers: trainer->setMemorySavers(command->savers); break;
                case Kind::CheckEquivalence: trainer->checkEquivalence(command->samples); break;
                }
                tell = said;
            }
            if (tell) tell(describe(*command) + " (from " + req.remote_addr + ")");
            reply(res, 200, {{"ok", true}, {"command", describe(*command)}});
        });
    }
};

RunServer::RunServer(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}

tl::expected<std::unique_ptr<RunServer>, std::string> RunServer::start(const ServeAddress& address,
                                                                       const std::string& runFolder) {
    auto impl = std::make_unique<Impl>();
    impl->host = address.host;
    impl->runFolder = runFolder;
    impl->spool = std::tmpfile();
    if (impl->spool == nullptr)
        return tl::unexpected(std::string("--serve: cannot make the temporary file that keeps the stream: ") +
                              std::strerror(errno));
    impl->offsets.push_back(0);
    impl->routes();
    if (address.port == 0) {
        impl->port = impl->server.bind_to_any_port(address.host);
        if (impl->port < 0) return tl::unexpected("--serve: cannot listen on " + address.host);
    } else {
        if (!impl->server.bind_to_port(address.host, address.port))
            return tl::unexpected("--serve: cannot listen on " + address.host + ":" + std::to_string(address.port) +
                                  " (in use by another program, or not an address of this machine): choose another "
                                  "port, or 0 for any free one");
        impl->port = address.port;
    }
    // httplib listens with a backlog of 5: a burst of connections (a window reconnecting while
    // others watch) would wait for SYN retries, a second or more each.
    if (impl->listenSocket >= 0) {
        ::listen(impl->listenSocket, kListenBacklog);
        impl->deadlines.watchPort(impl->listenSocket);
    }
    auto server = std::unique_ptr<RunServer>(new RunServer(std::move(impl)));
    // The URLs with their tokens, readable by this user only (O_EXCL: never one that was there).
    if (!runFolder.empty()) {
        server->m_impl->servePath = runFolder + "/serve.json";
        const std::string& path = server->m_impl->servePath;
        const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) return tl::unexpected("--serve: cannot write " + path + ": " + std::strerror(errno));
        const std::string text = json{{"url", server->url()}, {"watch_url", server->watchUrl()}}.dump(2) + "\n";
        const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
        ::close(fd);
        if (!written) return tl::unexpected("--serve: cannot write " + path + " (disk full?)");
    }
    Impl& started = *server->m_impl;
    started.listener = std::thread([&started] { started.server.listen_after_bind(); });
    return server;
}

RunServer::~RunServer() {
    m_impl->deadlines.cutAll();
    {
        const std::lock_guard lock(m_impl->mutex);
        m_impl->stopping = true;
        m_impl->trainer = nullptr;
    }
    m_impl->changed.notify_all();
    m_impl->server.stop();
    if (m_impl->listener.joinable()) m_impl->listener.join();
    if (m_impl->spool != nullptr) std::fclose(m_impl->spool);
}

void RunServer::onEvent(const core::Event& event) {
    constexpr size_t kSpoolWrite = 256 * 1024;  // one write per this much (a busy run: per ~1,000 events)
    const std::string line = core::toJsonLine(event) + "\n";
    {
        const std::lock_guard lock(m_impl->mutex);
        Impl& impl = *m_impl;
        if (impl.spoolFailed) return;
        impl.tail += line;
        impl.offsets.push_back(impl.offsets.back() + static_cast<int64_t>(line.size()));
        if (impl.tail.size() >= kSpoolWrite) impl.spoolTail();
    }
}

void RunServer::setConfiguration(std::string json) {
    const std::lock_guard lock(m_impl->mutex);
    m_impl->configuration = std::move(json);
}

void RunServer::setTrainer(core::Trainer* trainer, std::function<void(const std::string&)> said) {
    const std::lock_guard lock(m_impl->mutex);
    m_impl->trainer = trainer;
    m_impl->said = std::move(said);
}

void RunServer::finish() {
    {
        const std::lock_guard lock(m_impl->mutex);
        m_impl->ended = true;
        m_impl->trainer = nullptr;
    }
    m_impl->changed.notify_all();
}

void RunServer::drain(std::chrono::milliseconds limit) {
    std::unique_lock lock(m_impl->mutex);
    m_impl->changed.wait_for(lock, limit, [this] { return m_impl->streams == 0; });
}

namespace {

/// http://HOST:PORT/?token=TOKEN, an IPv6 host in brackets.
std::string serveUrl(const std::string& host, int port, const std::string& token) {
    const std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    return "http://" + shown + ":" + std::to_string(port) + "/?token=" + token;
}

}  // namespace

std::string RunServer::url() const {
    return serveUrl(m_impl->host, m_impl->port, m_impl->controlToken);
}

std::string RunServer::watchUrl() const {
    return serveUrl(m_impl->host, m_impl->port, m_impl->watchToken);
}

int RunServer::port() const {
    return m_impl->port;
}

const std::string& RunServer::servePath() const {
    return m_impl->servePath;
}

}  // namespace batchpilot::app
