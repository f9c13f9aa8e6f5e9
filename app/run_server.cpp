#include "app/run_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/config/option_schema.h"
#include "core/config/run_config.h"
#include "core/events/event_json.h"
#include "core/train/trainer.h"

namespace batchpilot::app {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr double kRequestsPerSecond = 100;  ///< per client address, with bursts of kBurst
constexpr double kBurst = 200;
constexpr auto kKeepAlive = std::chrono::seconds(15);  ///< a comment on a quiet stream
constexpr size_t kEventsPerWrite = 2048;
constexpr auto kStreamTick = std::chrono::milliseconds(50);  ///< a live stream's latency, at most

/// httplib's parser and router, run on a request the gate has read whole (RequestGate).
class Router final : public httplib::Server {
public:
    /// Streams stop writing once this is called (httplib ends a chunked answer when its server
    /// has no listening socket; this one never listens itself: the gate does).
    void open(int listeningSocket) { svr_sock_ = listeningSocket; }
    void close() { svr_sock_ = INVALID_SOCKET; }
    /// Answers the one request `stream` holds; whether the connection may carry another.
    bool answer(httplib::Stream& stream) {
        bool closed = false;
        const bool written = process_request(stream, /*close_connection=*/false, closed, [](httplib::Request&) {});
        return written && !closed;
    }
};

/// A position in the stream (Last-Event-ID, from): decimal digits only, at most `last`.
std::optional<size_t> position(const std::string& text, size_t last) {
    if (text.empty() || text.size() > 19 ||
        !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return std::nullopt;
    const unsigned long long n = std::stoull(text);
    if (n > last) return std::nullopt;
    return static_cast<size_t>(n);
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
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) || std::stoi(port) > 65535)
        return tl::unexpected("--serve: the port must be a whole number from 0 to 65535 (0: any free one), got \"" +
                              port + "\"");
    address.port = std::stoi(port);
    auto resolved = resolveServeHost(address.host, address.port, anyAddressAllowed);
    if (!resolved) return tl::unexpected(resolved.error());
    address.resolved = *resolved;
    address.loopback = isLoopbackAddress(resolved->address);
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
    const auto parsed = core::parseJsonText(body, "the command");
    if (!parsed) return tl::unexpected(parsed.error());
    const json& j = *parsed;
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
    // A key the command does not take is a mistake to name, not to ignore ("target": 2048).
    const std::vector<std::string> takes = [&]() -> std::vector<std::string> {
        switch (command.kind) {
        case Kind::TargetBatch: return {"command", "target_batch", "lr_scaling"};
        case Kind::Device: return {"command", "device", "rank"};
        case Kind::MemorySavers: return {"command", "memory_savers"};
        case Kind::CheckEquivalence: return {"command", "samples"};
        case Kind::Pause:
        case Kind::Resume:
        case Kind::Stop:
        case Kind::Reprobe: return {"command"};
        }
        return {"command"};
    }();
    for (const auto& [key, value] : j.items()) {
        if (std::find(takes.begin(), takes.end(), key) != takes.end()) continue;
        std::string list;
        for (const std::string& k : takes) list += (list.empty() ? "\"" : ", \"") + k + "\"";
        return tl::unexpected("the command \"" + text + "\" takes no \"" + key + "\": its keys are " + list);
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
    Router server;
    std::unique_ptr<RequestGate> gate;  // after the server: every connection ends before the router goes
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
    Access access(const std::string& token) const {
        if (sameToken(token, controlToken)) return Access::Control;
        if (sameToken(token, watchToken)) return Access::Watch;
        return Access::None;
    }
    Access access(const httplib::Request& req) const {
        const std::string header = req.get_header_value("Authorization");
        if (header.rfind("Bearer ", 0) == 0) return access(header.substr(7));
        return access(req.has_param("token") ? req.get_param_value("token") : std::string());
    }
    /// The gate's check, on the head as sent, before any body is read.
    std::optional<Refusal> admit(const RequestHead& head) const {
        std::string token;
        if (const std::string* header = head.header("Authorization"); header && header->rfind("Bearer ", 0) == 0)
            token = header->substr(7);
        else if (const auto param = head.param("token"))
            token = std::string(*param);
        if (access(token) == Access::None)
            return Refusal{401,
                           "a token is needed: the URL batchpilot-cli printed (…/?token=…), or the header "
                           "\"Authorization: Bearer TOKEN\""};
        // httplib drops a header without a value: an empty position would read as none.
        if (const std::string* last = head.header("Last-Event-ID"); last && last->empty())
            return Refusal{400, "Last-Event-ID: the number of the last event received, not empty"};
        return std::nullopt;
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
        server.set_payload_max_length(GateLimits{}.maxBodyBytes);  // the gate's limit, again
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
            size_t count = 0;
            {
                const std::lock_guard lock(mutex);
                count = offsets.size() - 1;
            }
            const std::string numbers = " (" + std::to_string(count) + " events so far)";
            if (req.has_header("Last-Event-ID")) {
                const auto last = position(req.get_header_value("Last-Event-ID"), count);
                if (!last)
                    return refuse(
                        res, 400,
                        "Last-Event-ID: the number of the last event received, from 0 to the events sent" + numbers);
                next = *last;
            } else if (req.has_param("from")) {
                const auto from = position(req.get_param_value("from"), count + 1);
                if (!from || *from == 0)
                    return refuse(res, 400, "from: the number of the first event wanted, from 1" + numbers);
                next = *from - 1;
            }
            res.set_header("Cache-Control", "no-cache");
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
    Impl& routed = *impl;
    RequestGate::Handlers handlers;
    handlers.admit = [&routed](const RequestHead& head) { return routed.admit(head); };
    handlers.holdsConnection = [](const RequestHead& head) { return head.method == "GET" && head.path() == "/events"; };
    handlers.answer = [&routed](httplib::Stream& stream) { return routed.server.answer(stream); };
    auto gate = RequestGate::open(address.resolved, GateLimits{}, std::move(handlers));
    if (!gate) return tl::unexpected(gate.error());
    impl->gate = std::move(*gate);
    impl->port = impl->gate->port();
    impl->server.open(impl->gate->listeningSocket());
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
    return server;
}

RunServer::~RunServer() {
    {
        const std::lock_guard lock(m_impl->mutex);
        m_impl->stopping = true;
        m_impl->trainer = nullptr;
    }
    m_impl->changed.notify_all();
    m_impl->server.close();
    m_impl->gate.reset();  // every connection shut, the workers joined
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
