// batchpilot-cli --serve, as the window and a hostile network would use it: a real CLI process
// training, its stream read over HTTP from the start and resumed after a cut with nothing lost or
// repeated (checked against the run folder's events.jsonl), commands that act on the run (checked
// in its events), tokens that refuse and change nothing, loopback unless asked, and clients that
// send garbage, huge bodies, nothing at all, or a request a byte at a time while the run trains on.

#include <QtTest>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <QDir>
#include <QProcess>
#include <QTemporaryDir>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/app/loopback.h"

namespace {

using nlohmann::json;

constexpr int kTimeout = 300'000;

struct Served {
    QString folder;
    int port = 0;
    std::string control;
    std::string watch;
};

/// Starts a CLI run that serves on a free port and waits for its serve.json.
bool startServing(QProcess& cli, const QString& runs, Served& served, QStringList extra = {}) {
    cli.start(QStringLiteral(BATCHPILOT_CLI_PATH),
              QStringList{QStringLiteral("--model"), QStringLiteral("cnn"), QStringLiteral("--device"),
                          QStringLiteral("virtual:24MiB"), QStringLiteral("--target-batch"), QStringLiteral("256"),
                          QStringLiteral("--samples"), QStringLiteral("2048"), QStringLiteral("--steps"),
                          QStringLiteral("100000"), QStringLiteral("--threads"), QStringLiteral("1"),
                          QStringLiteral("--quiet"), QStringLiteral("--runs-dir"), runs, QStringLiteral("--serve"),
                          QStringLiteral("0")} +
                  extra);
    if (!cli.waitForStarted()) return false;
    QElapsedTimer clock;
    clock.start();
    while (clock.elapsed() < kTimeout) {
        const QStringList folders = QDir(runs).entryList(QDir::Dirs | QDir::NoDotAndDotDot);
        if (folders.size() == 1) {
            served.folder = QDir(runs).filePath(folders.front());
            std::ifstream in(QDir(served.folder).filePath(QStringLiteral("serve.json")).toStdString());
            const json j = json::parse(in, nullptr, false);
            if (j.is_object()) {
                const std::string url = j.at("url");
                const std::string watch = j.at("watch_url");
                served.port = std::stoi(url.substr(url.rfind(':') + 1));
                served.control = url.substr(url.find("token=") + 6);
                served.watch = watch.substr(watch.find("token=") + 6);
                return true;
            }
        }
        QTest::qWait(50);
    }
    return false;
}

httplib::Headers bearer(const std::string& token) {
    return {{"Authorization", "Bearer " + token}};
}

/// The stream's records (id, data) from `headers`' position, until `count` were read or it ended.
std::vector<std::pair<long, std::string>> readStream(int port, const std::string& path, httplib::Headers headers,
                                                     size_t count) {
    std::vector<std::pair<long, std::string>> records;
    std::string buffer;
    long id = 0;
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(std::chrono::seconds(60));
    client.Get(path.c_str(), headers, [&](const char* data, size_t length) {
        buffer.append(data, length);
        size_t end;
        while ((end = buffer.find("\n\n")) != std::string::npos) {
            const std::string record = buffer.substr(0, end);
            buffer.erase(0, end + 2);
            std::string text;
            for (size_t at = 0; at < record.size();) {
                const size_t newline = std::min(record.find('\n', at), record.size());
                const std::string line = record.substr(at, newline - at);
                if (line.rfind("id: ", 0) == 0) id = std::stol(line.substr(4));
                if (line.rfind("data: ", 0) == 0) text = line.substr(6);
                at = newline + 1;
            }
            if (!text.empty()) records.emplace_back(id, text);
            if (records.size() >= count) return false;
        }
        return true;
    });
    return records;
}

std::vector<std::string> fileLines(const QString& folder) {
    std::vector<std::string> lines;
    std::ifstream in(QDir(folder).filePath(QStringLiteral("events.jsonl")).toStdString());
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

bool hasEvent(const QString& folder, const std::string& type, const std::string& key, const json& value) {
    for (const std::string& line : fileLines(folder)) {
        const json j = json::parse(line, nullptr, false);
        if (j.is_object() && j.value("type", std::string()) == type && j.contains(key) && j.at(key) == value)
            return true;
    }
    return false;
}

int stepsIn(const QString& folder) {
    int steps = 0;
    for (const std::string& line : fileLines(folder)) steps += line.find("\"type\":\"step\"") != std::string::npos;
    return steps;
}

void stopRun(QProcess& cli, const Served& served) {
    httplib::Client client("127.0.0.1", served.port);
    client.Post("/command", bearer(served.control), R"({"command":"stop"})", "application/json");
    if (!cli.waitForFinished(kTimeout)) cli.kill();
}

}  // namespace

class TestServe : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void streamFromTheStartResumedWithoutLossOrRepeat() {
        QTemporaryDir runs;
        QProcess cli;
        Served served;
        QVERIFY(startServing(cli, runs.path(), served));
        // The tokens are the owner's alone.
        struct stat status {};
        QCOMPARE(::stat(QDir(served.folder).filePath(QStringLiteral("serve.json")).toLocal8Bit().constData(), &status),
                 0);
        QCOMPARE(status.st_mode & 0777, 0600u);
        QCOMPARE(served.control.size(), size_t{32});
        QVERIFY(served.control != served.watch);

        // A late client gets the run from its first event; a cut after 150, resumed from the last
        // id it saw, goes on with the next.
        QTRY_VERIFY_WITH_TIMEOUT(stepsIn(served.folder) >= 3, kTimeout);
        const auto first = readStream(served.port, "/events", bearer(served.watch), 150);
        QCOMPARE(first.size(), size_t{150});
        for (size_t i = 0; i < first.size(); ++i) QCOMPARE(first[i].first, static_cast<long>(i + 1));
        httplib::Headers resume = bearer(served.watch);
        resume.emplace("Last-Event-ID", std::to_string(first.back().first));
        const auto second = readStream(served.port, "/events", resume, 100);
        QCOMPARE(second.size(), size_t{100});
        QCOMPARE(second.front().first, first.back().first + 1);
        // ?from=N starts at N.
        const auto from = readStream(served.port, "/events?from=120", bearer(served.control), 1);
        QCOMPARE(from.front().first, 120L);
        QCOMPARE(from.front().second, first[119].second);

        // A stream open from the start when the run stops ends after the run's last event, and
        // holds exactly the run folder's events.jsonl, line by line.
        std::vector<std::pair<long, std::string>> all;
        std::thread reader([&] { all = readStream(served.port, "/events", bearer(served.watch), 10'000'000); });
        QTest::qWait(500);
        stopRun(cli, served);
        reader.join();
        QCOMPARE(cli.exitCode(), 0);
        const std::vector<std::string> lines = fileLines(served.folder);
        QCOMPARE(all.size(), lines.size());
        for (size_t i = 0; i < all.size(); ++i) {
            QCOMPARE(all[i].first, static_cast<long>(i + 1));
            QCOMPARE(all[i].second, lines[i]);
        }
        QVERIFY(lines.back().find("\"state\":\"finished\"") != std::string::npos);
        for (size_t i = 0; i < first.size(); ++i) QCOMPARE(first[i].second, lines.at(i));
        for (size_t i = 0; i < second.size(); ++i) QCOMPARE(second[i].second, lines.at(first.size() + i));
    }

    void commandsActOnTheRunAndTokensGuardThem() {
        QTemporaryDir runs;
        QProcess cli;
        Served served;
        QVERIFY(startServing(cli, runs.path(), served));
        QTRY_VERIFY_WITH_TIMEOUT(stepsIn(served.folder) >= 2, kTimeout);
        httplib::Client client("127.0.0.1", served.port);

        // No token, a wrong one, a watch token for a command: refused, and nothing happens.
        auto none = client.Post("/command", R"({"command":"pause"})", "application/json");
        QVERIFY(none);
        QCOMPARE(none->status, 401);
        auto wrong =
            client.Post("/command", bearer(std::string(32, 'a')), R"({"command":"pause"})", "application/json");
        QCOMPARE(wrong->status, 401);
        auto read = client.Get("/", bearer(std::string(31, 'a')));
        QCOMPARE(read->status, 401);
        auto watched = client.Post("/command", bearer(served.watch), R"({"command":"pause"})", "application/json");
        QCOMPARE(watched->status, 403);
        QVERIFY(client.Get("/", bearer(served.watch))->status == 200);
        // The same in the URL's form, the one users are given (…/?token=…).
        const auto query = [&](const std::string& path, const std::string& token) {
            return path + (path.find('?') == std::string::npos ? "?" : "&") + "token=" + token;
        };
        auto watchedByUrl = client.Get(query("/", served.watch));
        QVERIFY(watchedByUrl);
        QCOMPARE(watchedByUrl->status, 200);
        QVERIFY2(watchedByUrl->body.find("\"access\":\"watch\"") != std::string::npos, watchedByUrl->body.c_str());
        QCOMPARE(client.Get(query("/", served.control))->status, 200);
        QCOMPARE(client.Get(query("/", ""))->status, 401);
        QCOMPARE(client.Get(query("/", std::string(32, 'a')))->status, 401);
        QCOMPARE(client.Get(query("/", served.watch + "x"))->status, 401);
        QCOMPARE(client.Post(query("/command", served.watch), R"({"command":"pause"})", "application/json")->status,
                 403);
        // Paths that climb out or name no route: nothing but a refusal, never a file.
        for (const std::string path : {"/../../../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/events/../../etc",
                                       "/config/..%2f..%2fetc%2fpasswd"}) {
            auto climbed = client.Get(query(path, served.control));
            QVERIFY2(climbed, path.c_str());
            QVERIFY2(climbed->status == 404 || climbed->status == 400, path.c_str());
            QVERIFY2(climbed->body.find("root:") == std::string::npos, path.c_str());
        }
        QTest::qWait(1000);
        QVERIFY2(!hasEvent(served.folder, "state", "state", "paused"), "a refused pause paused the run");

        // Commands checked as the command line checks the same values.
        auto negative = client.Post("/command", bearer(served.control),
                                    R"({"command":"target_batch","target_batch":-5})", "application/json");
        QCOMPARE(negative->status, 400);
        QVERIFY2(
            negative->body.find("target_batch") != std::string::npos && negative->body.find("-5") != std::string::npos,
            negative->body.c_str());
        QCOMPARE(client.Post("/command", bearer(served.control), R"({"command":"fly"})", "application/json")->status,
                 400);
        QCOMPARE(client.Post("/command", bearer(served.control), "not json", "application/json")->status, 400);

        // And they act: pause and resume, a new target batch at the next training batch, stop.
        QCOMPARE(client.Post("/command", bearer(served.control), R"({"command":"pause"})", "application/json")->status,
                 200);
        QTRY_VERIFY_WITH_TIMEOUT(hasEvent(served.folder, "state", "state", "paused"), kTimeout);
        QCOMPARE(client.Post("/command", bearer(served.control), R"({"command":"resume"})", "application/json")->status,
                 200);
        QCOMPARE(client
                     .Post("/command", bearer(served.control),
                           R"({"command":"target_batch","target_batch":512,"lr_scaling":"linear"})", "application/json")
                     ->status,
                 200);
        QTRY_VERIFY_WITH_TIMEOUT(hasEvent(served.folder, "target_batch", "new_target", 512), kTimeout);
        // More than 100 requests a second from one address (bursts of 200): the rest are told to
        // slow down, and the address is served again once its budget has come back (2 s).
        // Four clients at once, so that a slow (sanitized) server is still asked faster than that.
        std::atomic<bool> slowedDown{false};
        std::atomic<bool> saidWhy{false};
        std::vector<std::thread> clients;
        for (int c = 0; c < 4; ++c)
            clients.emplace_back([&] {
                httplib::Client flood("127.0.0.1", served.port);
                for (int i = 0; i < 1000 && !slowedDown; ++i) {
                    auto answer = flood.Get(query("/", served.watch));
                    if (answer && answer->status == 429) {
                        saidWhy = answer->body.find("slow down") != std::string::npos;
                        slowedDown = true;
                    }
                }
            });
        for (std::thread& t : clients) t.join();
        QVERIFY2(slowedDown, "4,000 requests at once were all answered");
        QVERIFY(saidWhy);
        // Once the budget has come back (2 s at 100 a second) the address has a whole burst again.
        // (One request per check: QTRY evaluates its condition again after it holds, and that
        // second request, a millisecond later, found the budget still empty.)
        QTest::qWait(2'500);
        for (int i = 0; i < 150; ++i) {
            auto answer = client.Get(query("/", served.watch));
            QVERIFY2(answer, "the server stopped answering after the flood");
            QCOMPARE(answer->status, 200);
        }
        stopRun(cli, served);
        QCOMPARE(cli.exitCode(), 0);
        QVERIFY(hasEvent(served.folder, "state", "detail", "stopped"));
        QVERIFY(cli.readAllStandardError().contains("remote command: target batch -> 512"));
    }

    void clientsCannotEndHangOrMisleadTheRun() {
        QTemporaryDir runs;
        QProcess cli;
        Served served;
        QVERIFY(startServing(cli, runs.path(), served));
        QTRY_VERIFY_WITH_TIMEOUT(stepsIn(served.folder) >= 2, kTimeout);

        // Clients without a token that send 1 MiB of noise and go away: the answers the server
        // writes to them raised SIGPIPE, which ended the run (exit 141).
        std::string noise(1 << 20, '\0');
        uint32_t state = 12345;
        for (char& c : noise) c = static_cast<char>((state = state * 1664525u + 1013904223u) >> 24);
        for (int i = 0; i < 8; ++i) {
            const int fd = batchpilot::test::loopbackConnection(served.port);
            QVERIFY(fd >= 0);
            (void)!::send(fd, noise.data(), noise.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
            ::close(fd);
        }
        QTest::qWait(500);
        QCOMPARE(cli.state(), QProcess::Running);

        // Positions that are not ones: refused at once, never a stream that spins.
        httplib::Client client("127.0.0.1", served.port);
        client.set_read_timeout(std::chrono::seconds(10));
        for (const char* last :
             {"18446744073709551615", "18446744073709551616", "99999999999999999999999", "-1", "1e3", "100000000"}) {
            httplib::Headers headers = bearer(served.watch);
            headers.emplace("Last-Event-ID", last);
            auto answer = client.Get("/events", headers);
            QVERIFY2(answer && answer->status == 400, last);
            QVERIFY2(answer->body.find("Last-Event-ID") != std::string::npos, answer->body.c_str());
        }
        for (const char* from : {"18446744073709551616", "0", "100000000", "x"}) {
            auto answer = client.Get(("/events?from=" + std::string(from)).c_str(), bearer(served.watch));
            QVERIFY2(answer && answer->status == 400, from);
        }
        // An empty Last-Event-ID (httplib's own parser would drop the header, starting from 0).
        const int empty = batchpilot::test::loopbackConnection(served.port);
        const std::string request =
            "GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + served.watch + "\r\nLast-Event-ID:\r\n\r\n";
        (void)!::send(empty, request.data(), request.size(), MSG_NOSIGNAL);
        char answer[512] = {};
        const ssize_t got = ::recv(empty, answer, sizeof answer - 1, 0);
        ::close(empty);
        QVERIFY2(got > 0 && std::string(answer).find(" 400 ") != std::string::npos, answer);

        // Commands read as strictly as a configuration file, with its messages.
        const auto refused = [&](const std::string& body, const char* says) {
            auto answer = client.Post("/command", bearer(served.control), body, "application/json");
            if (!answer || answer->status != 400 || answer->body.find(says) == std::string::npos) {
                qWarning("%s -> %d %s", body.c_str(), answer ? answer->status : -1, answer ? answer->body.c_str() : "");
                return false;
            }
            return true;
        };
        QVERIFY(refused(R"({"command":"pause","command":"stop"})", "twice"));
        QVERIFY(refused(std::string(R"({"command":"stop"})") + std::string(3, '\0'), "NUL"));
        QVERIFY(refused(R"({"command":"pause","target_batch":5})", "takes no"));
        QVERIFY(refused(R"({"command":"target_batch","target":2048})", "target_batch"));
        QVERIFY(refused(R"({"command":"memory_savers","memory_savers":"FP16"})", "lower case (\\\"fp16\\\")"));
        QVERIFY(refused(R"({"command":"device","device":"virtual:H200/exact/caching"})", "takes no other"));
        QVERIFY(refused(R"({"command":"target_batch","target_batch":0})",
                        "target_batch: expected an integer from 1 to 2147483648, got 0"));
        QTest::qWait(500);
        QVERIFY2(!hasEvent(served.folder, "state", "state", "paused"), "a refused command acted");
        QCOMPARE(cli.state(), QProcess::Running);
        QTRY_VERIFY_WITH_TIMEOUT(stepsIn(served.folder) >= 4, kTimeout);
        stopRun(cli, served);
        QCOMPARE(cli.exitCode(), 0);
    }

    void onlyLoopbackUnlessAsked() {
        QTemporaryDir runs;
        QProcess cli;
        cli.start(QStringLiteral(BATCHPILOT_CLI_PATH),
                  {QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--steps"), QStringLiteral("1"),
                   QStringLiteral("--runs-dir"), runs.path(), QStringLiteral("--serve"), QStringLiteral("0.0.0.0:0")});
        QVERIFY(cli.waitForFinished(kTimeout));
        QCOMPARE(cli.exitCode(), 2);
        const QByteArray said = cli.readAllStandardError();
        QVERIFY2(said.contains("--serve-any-address") && said.contains("ssh -L"), said.constData());
        QVERIFY2(QDir(runs.path()).entryList(QDir::Dirs | QDir::NoDotAndDotDot).isEmpty(), "a run folder was made");
        // A name is judged by the address it resolves to, not by how it reads.
        for (const char* bad : {"127.attacker.example:0", "0.0.0.0:0", "[::]:0"}) {
            QProcess wrong;
            wrong.start(
                QStringLiteral(BATCHPILOT_CLI_PATH),
                {QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--steps"), QStringLiteral("1"),
                 QStringLiteral("--runs-dir"), runs.path(), QStringLiteral("--serve"), QString::fromLatin1(bad)});
            QVERIFY(wrong.waitForFinished(kTimeout));
            QVERIFY2(wrong.exitCode() == 2, bad);
            QVERIFY2(QDir(runs.path()).entryList(QDir::Dirs | QDir::NoDotAndDotDot).isEmpty(), bad);
        }
        for (const char* bad : {"70000", "x", "host:", ":80", "-1", "+80", "080000"}) {
            QProcess wrong;
            wrong.start(
                QStringLiteral(BATCHPILOT_CLI_PATH),
                {QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--steps"), QStringLiteral("1"),
                 QStringLiteral("--no-run-folder"), QStringLiteral("--serve"), QString::fromLatin1(bad)});
            QVERIFY(wrong.waitForFinished(kTimeout));
            QVERIFY2(wrong.exitCode() == 2, bad);
        }
    }

    void hostileClientsDoNotStopTheRun() {
        QTemporaryDir runs;
        QProcess cli;
        Served served;
        QVERIFY(startServing(cli, runs.path(), served));
        QTRY_VERIFY_WITH_TIMEOUT(stepsIn(served.folder) >= 2, kTimeout);
        const int stepsBefore = stepsIn(served.folder);

        // 500 connections that say nothing, held open.
        std::vector<int> idle;
        for (int i = 0; i < 500; ++i)
            if (const int fd = batchpilot::test::loopbackConnection(served.port); fd >= 0) idle.push_back(fd);
        QCOMPARE(idle.size(), size_t{500});
        // A slow-drip client: a request's header a byte every 300 ms, never finished. The server
        // cuts it when a whole request has not arrived within 10 s. It comes from another address:
        // the flood below, from 127.0.0.1, may make room for itself by closing that address's
        // oldest unfinished connections, which a slow server (under a sanitizer) reaches.
        const int drip = batchpilot::test::loopbackConnection(served.port, "127.0.0.2");
        QVERIFY(drip >= 0);
        QElapsedTimer dripping;
        dripping.start();
        std::atomic<bool> dripCut{false};
        std::atomic<bool> giveUp{false};
        std::thread dripper([&] {
            const std::string text = "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + std::string(1000, 'z');
            for (const char c : text) {
                if (giveUp) return;
                if (::send(drip, &c, 1, MSG_NOSIGNAL) != 1) break;
                char byte = 0;
                if (::recv(drip, &byte, 1, MSG_DONTWAIT) == 0) break;  // the server closed it
                std::this_thread::sleep_for(std::chrono::milliseconds(300));
            }
            dripCut = true;
        });
        const auto joinDripper = qScopeGuard([&] {
            giveUp = true;
            dripper.join();
            ::close(drip);
        });
        // 10,000 malformed requests, of six kinds, one connection each.
        const std::vector<std::string> garbage = {"\x01\x02\x03\r\n\r\n",
                                                  "GET\r\n\r\n",
                                                  "GET / HTTP/9.9\r\n\r\n",
                                                  "POST /command HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
                                                  "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n",
                                                  "GET / HTTP/1.1\r\nX: " + std::string(20000, 'b') + "\r\n\r\n"};
        int sent = 0;
        for (int i = 0; i < 10'000; ++i) {
            const int fd = batchpilot::test::loopbackConnection(served.port);
            if (fd < 0) continue;
            const std::string& text = garbage[static_cast<size_t>(i) % garbage.size()];
            sent += ::send(fd, text.data(), text.size(), MSG_NOSIGNAL) > 0;
            ::close(fd);
        }
        QVERIFY2(sent >= 9'900, qPrintable(QString::number(sent)));
        // The requests of the flood that parsed used up this address's budget (100 a second, bursts
        // of 200: answered 429 meanwhile); it is whole again within 2 s.
        QTest::qWait(2'500);
        // A body claimed at 1 GB is refused from its header, not read.
        httplib::Client client("127.0.0.1", served.port);
        client.set_connection_timeout(std::chrono::seconds(30));
        client.set_read_timeout(std::chrono::seconds(30));
        const int big = batchpilot::test::loopbackConnection(served.port);
        const std::string header = "POST /command HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + served.control +
                                   "\r\nContent-Length: 1000000000\r\n\r\n{";
        (void)!::send(big, header.data(), header.size(), MSG_NOSIGNAL);
        char answer[256] = {};
        const ssize_t got = ::recv(big, answer, sizeof answer - 1, 0);
        ::close(big);
        QVERIFY2(got > 0 && std::string(answer).find(" 413 ") != std::string::npos, answer);

        // The server still answers, and the run still trains.
        QElapsedTimer clock;
        clock.start();
        auto state = client.Get("/", bearer(served.watch));
        QVERIFY2(state && state->status == 200, "the server stopped answering");
        QVERIFY2(clock.elapsed() < 10'000, qPrintable(QString::number(clock.elapsed())));
        qInfo("answered in %lld ms after 10,000 malformed requests, with 500 idle connections open",
              static_cast<long long>(clock.elapsed()));
        for (const int fd : idle) ::close(fd);
        while (!dripCut && dripping.elapsed() < 40'000) QTest::qWait(100);
        QVERIFY2(dripCut, "a request sent a byte at a time was not cut within 40 s");
        // Cut by the deadline (10 s, checked every 0.25 s), not after the whole header was sent
        // (300 s) nor by a read timeout.
        QVERIFY2(dripping.elapsed() >= 9'500 && dripping.elapsed() < 30'000,
                 qPrintable(QString::number(dripping.elapsed())));
        QTRY_VERIFY_WITH_TIMEOUT(stepsIn(served.folder) > stepsBefore + 2, kTimeout);
        stopRun(cli, served);
        QCOMPARE(cli.exitCode(), 0);
    }
};

QTEST_MAIN(TestServe)
#include "tst_serve.moc"
