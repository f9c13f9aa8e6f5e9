// The front of --serve (app/request_gate.h) in this process, against raw sockets: what a client
// can send before its token is checked. A request's head held to its limits whatever it claims,
// bodies only by Content-Length and only after the token, no SIGPIPE from a client that goes away
// (this process would die of it), a quick client served while hundreds of slow ones hold
// connections, no thread per connection, and a clear 503 when the workers are taken. The
// reference for each answer is HTTP's own status codes (RFC 9110) and the kernel's view of the
// connection (whether the server closed it, how much it read).

#include <QtTest>

#include "tests/sanitized.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "app/request_gate.h"
#include "tests/app/loopback.h"

namespace {

using batchpilot::app::GateLimits;
using batchpilot::app::ListenAddress;
using batchpilot::app::parseRequestHead;
using batchpilot::app::Refusal;
using batchpilot::app::RequestGate;
using batchpilot::app::RequestHead;
using batchpilot::app::resolveServeHost;

constexpr const char* kToken = "0123456789abcdef0123456789abcdef";
// The time bounds below tell a client served from one locked out or left waiting; under a
// sanitizer this process runs a few times slower, and the bounds follow.
constexpr int kSlowdown = batchpilot::test::kSanitizerSlowdown;

/// httplib's router on the requests the gate hands over: "/" answers "ok", "/stream" writes
/// until the test ends, "/echo" answers the body it got.
class Router final : public httplib::Server {
public:
    Router() {
        Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok", "text/plain"); });
        Post("/echo",
             [](const httplib::Request& req, httplib::Response& res) { res.set_content(req.body, "text/plain"); });
        Get("/stream", [this](const httplib::Request&, httplib::Response& res) {
            res.set_chunked_content_provider("text/event-stream", [this](size_t, httplib::DataSink& sink) {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
                if (m_done) return false;
                return sink.write(": tick\n\n", 8);
            });
        });
    }
    void open(int fd) { svr_sock_ = fd; }
    void close() {
        m_done = true;
        svr_sock_ = INVALID_SOCKET;
    }
    bool answer(httplib::Stream& stream) {
        bool closed = false;
        return process_request(stream, false, closed, [](httplib::Request&) {}) && !closed;
    }

private:
    std::atomic<bool> m_done{false};
};

struct Served {
    Router router;
    std::unique_ptr<RequestGate> gate;
    ~Served() {
        router.close();
        gate.reset();
    }
};

std::unique_ptr<Served> serve(GateLimits limits = {}) {
    auto served = std::make_unique<Served>();
    auto address = resolveServeHost("127.0.0.1", 0, false);
    if (!address) return nullptr;
    RequestGate::Handlers handlers;
    handlers.admit = [](const RequestHead& head) -> std::optional<Refusal> {
        const std::string* auth = head.header("Authorization");
        if (auth == nullptr || *auth != std::string("Bearer ") + kToken) return Refusal{401, "no token"};
        return std::nullopt;
    };
    handlers.holdsConnection = [](const RequestHead& head) { return head.path() == "/stream"; };
    Router& router = served->router;
    handlers.answer = [&router](httplib::Stream& stream) { return router.answer(stream); };
    auto gate = RequestGate::open(*address, limits, std::move(handlers));
    if (!gate) return nullptr;
    served->gate = std::move(*gate);
    served->router.open(served->gate->listeningSocket());
    return served;
}

/// Sends `text` (as much as the server takes within `limit`); returns the bytes sent.
size_t sendAll(int fd, const std::string& text, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    size_t sent = 0;
    const auto until = std::chrono::steady_clock::now() + limit;
    while (sent < text.size() && std::chrono::steady_clock::now() < until) {
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        const ssize_t n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
    }
    return sent;
}

/// What the server sent until it closed the connection, or `limit` passed, or (when given) it
/// sent `awaited`.
std::string readAll(int fd, std::chrono::milliseconds limit = std::chrono::seconds(10),
                    const std::string& awaited = {}) {
    std::string text;
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until && (awaited.empty() || text.find(awaited) == std::string::npos)) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        char chunk[4096];
        const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
        if (n <= 0) break;
        text.append(chunk, static_cast<size_t>(n));
    }
    return text;
}

/// The status of the first answer in `text`, or 0.
int statusOf(const std::string& text) {
    if (text.rfind("HTTP/1.1 ", 0) != 0 || text.size() < 12) return 0;
    return std::atoi(text.c_str() + 9);
}

/// One request on a fresh connection; the answer's status.
int ask(int port, const std::string& request) {
    const int fd = batchpilot::test::loopbackConnection(port);
    if (fd < 0) return -1;
    sendAll(fd, request);
    const int status = statusOf(readAll(fd, std::chrono::seconds(5)));
    ::close(fd);
    return status;
}

std::string authorized(const std::string& line, const std::string& more = {}) {
    return line + "\r\nHost: x\r\nAuthorization: Bearer " + kToken + "\r\nConnection: close\r\n" + more + "\r\n";
}

int threadsOfThisProcess() {
    int count = 0;
    if (DIR* dir = ::opendir("/proc/self/task")) {
        while (const dirent* entry = ::readdir(dir)) count += entry->d_name[0] != '.';
        ::closedir(dir);
    }
    return count;
}

}  // namespace

class TestRequestGate : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void headsAreReadStrictly_data() {
        QTest::addColumn<QByteArray>("head");
        QTest::addColumn<int>("status");  // 0: read
        QTest::newRow("plain") << QByteArray("GET /events?from=3 HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 7\r\n\r\n") << 0;
        QTest::newRow("HTTP/1.0") << QByteArray("GET / HTTP/1.0\r\n\r\n") << 0;
        QTest::newRow("not HTTP") << QByteArray("\x01\x02\x03\r\n\r\n") << 400;
        QTest::newRow("no version") << QByteArray("GET /\r\n\r\n") << 400;
        QTest::newRow("HTTP/9.9") << QByteArray("GET / HTTP/9.9\r\n\r\n") << 400;
        QTest::newRow("target not a path") << QByteArray("GET x HTTP/1.1\r\n\r\n") << 400;
        QTest::newRow("bare LF in a header") << QByteArray("GET / HTTP/1.1\r\nA: 1\nB: 2\r\n\r\n") << 400;
        QTest::newRow("NUL in a header") << QByteArray(
                                                "GET / HTTP/1.1\r\nA: 1\0"
                                                "2\r\n\r\n",
                                                25)
                                         << 400;
        QTest::newRow("no colon") << QByteArray("GET / HTTP/1.1\r\nHost x\r\n\r\n") << 400;
        QTest::newRow("folded line") << QByteArray("GET / HTTP/1.1\r\nA: 1\r\n  2\r\n\r\n") << 400;
        QByteArray many("GET / HTTP/1.1\r\n");
        for (int i = 0; i < 65; ++i) many += "X-" + QByteArray::number(i) + ": 1\r\n";
        QTest::newRow("65 headers") << many + "\r\n" << 431;
        QTest::newRow("17 KiB of headers") << "GET / HTTP/1.1\r\nX: " + QByteArray(17 * 1024, 'a') + "\r\n\r\n" << 431;
    }
    void headsAreReadStrictly() {
        QFETCH(QByteArray, head);
        QFETCH(int, status);
        const auto parsed = parseRequestHead(std::string_view(head.constData(), static_cast<size_t>(head.size())), {});
        if (status == 0) {
            QVERIFY2(parsed.has_value(), parsed ? "" : parsed.error().message.c_str());
        } else {
            QVERIFY(!parsed.has_value());
            QCOMPARE(parsed.error().status, status);
            QVERIFY(!parsed.error().message.empty());
        }
    }

    void headerValuesAndQueryAsSent() {
        const std::string text = "GET /events?x=1&token=abc&from= HTTP/1.1\r\nlast-event-id:  42 \r\nX-Empty:\r\n\r\n";
        const auto head = parseRequestHead(text, {});
        QVERIFY(head.has_value());
        QCOMPARE(head->path(), std::string_view("/events"));
        QCOMPARE(*head->param("token"), std::string_view("abc"));
        QCOMPARE(*head->param("from"), std::string_view(""));
        QVERIFY(!head->param("to"));
        QVERIFY(head->header("Last-Event-ID") != nullptr);
        QCOMPARE(*head->header("Last-Event-ID"), std::string("42"));
        // httplib drops a header with no value; the gate keeps it, so a handler can refuse it.
        QVERIFY(head->header("x-empty") != nullptr && head->header("x-empty")->empty());
    }

    void loopbackIsJudgedByTheAddress_data() {
        QTest::addColumn<QString>("host");
        QTest::addColumn<bool>("allowed");
        QTest::newRow("127.0.0.1") << "127.0.0.1" << true;
        QTest::newRow("127.8.9.10") << "127.8.9.10" << true;
        QTest::newRow("::1") << "::1" << true;
        QTest::newRow("localhost") << "localhost" << true;
        QTest::newRow("v4-mapped loopback") << "::ffff:127.0.0.1" << true;
        QTest::newRow("any IPv4") << "0.0.0.0" << false;
        QTest::newRow("any IPv6") << "::" << false;
        QTest::newRow("private") << "10.1.2.3" << false;
        QTest::newRow("v4-mapped private") << "::ffff:10.1.2.3" << false;
        // Reads as loopback, is a name: whatever it resolves to elsewhere, here it resolves to
        // nothing, and either way it is not taken on its looks.
        QTest::newRow("a name starting 127.") << "127.attacker.example" << false;
    }
    void loopbackIsJudgedByTheAddress() {
        QFETCH(QString, host);
        QFETCH(bool, allowed);
        const auto resolved = resolveServeHost(host.toStdString(), 0, /*anyAddressAllowed=*/false);
        QCOMPARE(resolved.has_value(), allowed);
        if (!allowed && host != QLatin1String("127.attacker.example"))
            QVERIFY2(resolved.error().find("--serve-any-address") != std::string::npos, resolved.error().c_str());
        if (host != QLatin1String("127.attacker.example"))
            QVERIFY(resolveServeHost(host.toStdString(), 0, /*anyAddressAllowed=*/true).has_value());
    }

    void refusesBeforeReadingWhatIsClaimed() {
        auto served = serve();
        QVERIFY(served);
        const int port = served->gate->port();
        QCOMPARE(ask(port, authorized("GET / HTTP/1.1")), 200);
        // Refused from the head: a body is never read, and never inflated.
        QCOMPARE(
            ask(port, authorized("POST /echo HTTP/1.1", "Transfer-Encoding: chunked\r\n") + "5\r\nhello\r\n0\r\n\r\n"),
            411);
        QCOMPARE(
            ask(port, authorized("POST /echo HTTP/1.1", "Content-Encoding: gzip\r\nContent-Length: 3\r\n") + "abc"),
            415);
        QCOMPARE(ask(port, authorized("POST /echo HTTP/1.1", "Content-Length: 1000000000\r\n") + "{"), 413);
        QCOMPARE(ask(port, authorized("POST /echo HTTP/1.1", "Content-Length: -1\r\n")), 400);
        QCOMPARE(ask(port, authorized("POST /echo HTTP/1.1", "Content-Length: 2\r\nContent-Length: 3\r\n") + "abc"),
                 400);
        // Without the token, a body is not waited for: the answer comes though none was sent.
        QCOMPARE(ask(port, "POST /echo HTTP/1.1\r\nContent-Length: 60000\r\n\r\n"), 401);
        // With it, a body within the limit arrives whole.
        const int fd = batchpilot::test::loopbackConnection(port);
        const std::string body(60'000, 'b');
        sendAll(fd, authorized("POST /echo HTTP/1.1", "Content-Length: 60000\r\n") + body);
        const std::string answer = readAll(fd);
        ::close(fd);
        QCOMPARE(statusOf(answer), 200);
        QVERIFY(answer.size() > body.size() && answer.compare(answer.size() - body.size(), body.size(), body) == 0);
        // A client that asks before sending its body (Expect: 100-continue) is told to go on at
        // once, not left to wait for its own timeout (curl's: a second).
        const int asking = batchpilot::test::loopbackConnection(port);
        sendAll(asking, authorized("POST /echo HTTP/1.1", "Content-Length: 5\r\nExpect: 100-continue\r\n"));
        QElapsedTimer clock;
        clock.start();
        std::string told;
        while (told.find("\r\n\r\n") == std::string::npos && clock.elapsed() < 5'000)
            told += readAll(asking, std::chrono::milliseconds(100));
        QVERIFY2(told.rfind("HTTP/1.1 100 Continue\r\n\r\n", 0) == 0, told.c_str());
        QVERIFY2(clock.elapsed() < 500 * kSlowdown, qPrintable(QString::number(clock.elapsed())));
        sendAll(asking, "hello");
        const std::string echoed = told + readAll(asking);
        ::close(asking);
        QVERIFY2(echoed.find("HTTP/1.1 200") != std::string::npos && echoed.size() >= 5 &&
                     echoed.compare(echoed.size() - 5, 5, "hello") == 0,
                 echoed.c_str());
    }

    void endlessHeadersAreCutAtTheLimit() {
        auto served = serve();
        QVERIFY(served);
        // A client that sends header lines for ever, with no token: the gate answers 431 once
        // its 16 KiB limit is passed, keeps nothing more, and closes the connection within a
        // second however long the client goes on.
        const int fd = batchpilot::test::loopbackConnection(served->gate->port());
        std::string lines = "GET / HTTP/1.1\r\n";
        for (int i = 0; lines.size() < 20 * 1024; ++i) lines += "X-" + std::to_string(i) + ": y\r\n";
        QCOMPARE(sendAll(fd, lines), lines.size());
        std::string answer;
        for (int i = 0; i < 50 && answer.find("\r\n\r\n") == std::string::npos; ++i) {
            char chunk[4096];
            pollfd p{fd, POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;
            const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
            if (n <= 0) break;
            answer.append(chunk, static_cast<size_t>(n));
        }
        QCOMPARE(statusOf(answer), 431);
        QElapsedTimer clock;
        clock.start();
        bool closed = false;
        const std::string more = "X-More: yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\r\n";
        while (!closed && clock.elapsed() < 5'000) {
            closed = ::send(fd, more.data(), more.size(), MSG_NOSIGNAL) < 0;
            if (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        ::close(fd);
        QVERIFY2(closed, "the server went on reading a head past its limit for 5 s");
        QVERIFY2(clock.elapsed() < 2'500 * kSlowdown, qPrintable(QString::number(clock.elapsed())));
    }

    void aClientThatGoesAwayRaisesNoSignal() {
        // This process keeps SIGPIPE's default action: a write to a closed connection would end it.
        auto served = serve();
        QVERIFY(served);
        const int port = served->gate->port();
        std::mt19937 random(7);
        std::string noise(1 << 20, '\0');
        for (char& c : noise) c = static_cast<char>(random());
        for (int i = 0; i < 8; ++i) {
            const int fd = batchpilot::test::loopbackConnection(port);
            sendAll(fd, noise, std::chrono::seconds(1));
            ::close(fd);
        }
        // A stream whose reader goes away mid-stream: its next write fails, the worker is freed.
        for (int i = 0; i < 4; ++i) {
            const int fd = batchpilot::test::loopbackConnection(port);
            sendAll(fd, authorized("GET /stream HTTP/1.1"));
            readAll(fd, std::chrono::milliseconds(200));
            ::close(fd);
        }
        QCOMPARE(ask(port, authorized("GET / HTTP/1.1")), 200);
    }

    void slowClientsDoNotLockOutAQuickOne() {
        GateLimits limits;
        limits.maxConnections = 128;
        limits.maxPerClient = 128;
        auto served = serve(limits);
        QVERIFY(served);
        const int port = served->gate->port();
        const int threadsBefore = threadsOfThisProcess();
        // 600 half-open requests, each a few bytes of a head that never ends: more than the gate
        // holds, so the oldest make room for newer ones.
        std::vector<int> slow;
        for (int i = 0; i < 600; ++i) {
            const int fd = batchpilot::test::loopbackConnection(port);
            if (fd < 0) continue;
            (void)!::send(fd, "GET / HTTP/1.1\r\nX-Slow: ", 24, MSG_NOSIGNAL);
            slow.push_back(fd);
        }
        QCOMPARE(slow.size(), size_t{600});
        QTest::qWait(300);
        QCOMPARE(threadsOfThisProcess(), threadsBefore);  // no thread per connection
        for (int i = 0; i < 5; ++i) {
            QElapsedTimer clock;
            clock.start();
            QCOMPARE(ask(port, authorized("GET / HTTP/1.1")), 200);
            QVERIFY2(clock.elapsed() < 1'000 * kSlowdown, qPrintable(QString::number(clock.elapsed())));
        }
        for (const int fd : slow) ::close(fd);
    }

    void aRequestMustArriveWithinTheDeadline() {
        GateLimits limits;
        limits.requestDeadline = std::chrono::milliseconds(600);
        limits.idleLimit = std::chrono::milliseconds(300);
        auto served = serve(limits);
        QVERIFY(served);
        const int fd = batchpilot::test::loopbackConnection(served->gate->port());
        QElapsedTimer clock;
        clock.start();
        const std::string text = "GET / HTTP/1.1\r\nX-Slow: abcdefghijklmnopqrstuvwxyz";
        bool cut = false;
        for (const char c : text) {
            if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) {
                cut = true;
                break;
            }
            char byte = 0;
            if (::recv(fd, &byte, 1, MSG_DONTWAIT) == 0) {
                cut = true;
                break;
            }
            QTest::qWait(50);
        }
        ::close(fd);
        QVERIFY2(cut, "a request sent a byte every 50 ms was not cut");
        QVERIFY2(clock.elapsed() >= 550 && clock.elapsed() < 2'000 * kSlowdown,
                 qPrintable(QString::number(clock.elapsed())));
    }

    void streamsBeyondTheWorkersAreRefusedClearly() {
        GateLimits limits;
        limits.streamWorkers = 2;
        auto served = serve(limits);
        QVERIFY(served);
        const int port = served->gate->port();
        std::vector<int> streams;
        for (int i = 0; i < 2; ++i) {
            const int fd = batchpilot::test::loopbackConnection(port);
            sendAll(fd, authorized("GET /stream HTTP/1.1"));
            // Streaming (a tick every 20 ms), however slow the machine: it holds a stream worker.
            QVERIFY(readAll(fd, std::chrono::seconds(10), ": tick").find(": tick") != std::string::npos);
            streams.push_back(fd);
        }
        const int third = batchpilot::test::loopbackConnection(port);
        sendAll(third, authorized("GET /stream HTTP/1.1"));
        const std::string answer = readAll(third);
        ::close(third);
        QCOMPARE(statusOf(answer), 503);
        QVERIFY2(answer.find("close a window or a stream") != std::string::npos, answer.c_str());
        // Short requests have workers of their own.
        QCOMPARE(ask(port, authorized("GET / HTTP/1.1")), 200);
        for (const int fd : streams) ::close(fd);
    }
};

QTEST_APPLESS_MAIN(TestRequestGate)
#include "tst_request_gate.moc"
