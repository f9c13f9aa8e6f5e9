// A run the window did not start, read from a folder or a server that lies: numbers no run can
// have are refused with the skipped line's message (they aborted the window or hung it), numbers
// a run can have however large cost no time in proportion to them, and a server that sends more
// than a run's answers hold is cut off with a message while the window's memory stays what it was.

#include <QtTest>

#include "tests/sanitized.h"
#include "tests/test_main.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <QAbstractItemModel>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QLabel>
#include <QProgressBar>
#include <QTableWidget>
#include <QTemporaryDir>

#include "core/events/event_json.h"
#include "ui/charts/charts_panel.h"
#include "ui/charts/probe_chart.h"
#include "ui/log/event_log.h"
#include "ui/session/remote_run.h"
#include "ui/session/run_model.h"
#include "ui/session/run_watcher.h"
#include "ui/teaching/accumulation_view.h"
#include "ui/window/main_window.h"
#include "ui/window/ranks_view.h"

namespace tst_hostile_runs {

using namespace batchpilot;

namespace {

// These bounds tell a hang (over a minute before the fix) from work that costs its due; under a
// sanitizer the window's own code runs about three times slower, and the bounds follow.
using batchpilot::test::kSanitizerSlowdown;
constexpr int kCatchUp = 20'000 * kSanitizerSlowdown;  // ms: a few MB of events on a loaded 2-core machine
constexpr int kDrawn = 5'000 * kSanitizerSlowdown;     // ms: the whole window drawn once
constexpr int64_t kLargest = int64_t{1} << 31;         // the largest target batch a run can have
constexpr int64_t kTooMuch = std::numeric_limits<int64_t>::max();

std::string line(const core::Event& event) {
    return core::toJsonLine(event);
}

core::RankStep rankStep(int rank, int64_t share, int64_t microBatch) {
    core::RankStep r;
    r.rank = rank;
    r.device = "virtual:24MiB";
    r.share = share;
    r.microBatch = microBatch;
    r.microBatches = microBatch > 0 ? (share + microBatch - 1) / microBatch : 0;
    r.computeSeconds = 0.1;
    r.samplesPerSecond = 100;
    return r;
}

core::RanksStepped ranksStepped(int64_t step, std::vector<core::RankStep> ranks) {
    core::RanksStepped e;
    e.time = 1.0 + static_cast<double>(step);
    e.step = step;
    e.ranks = std::move(ranks);
    e.collectives = "Gloo";
    e.imbalance = 1;
    return e;
}

core::ProbeTrial trial(int sequence, int number, int64_t microBatch, bool fit) {
    return core::ProbeTrial{0.1 * number,   sequence, number, microBatch, fit, fit, 1'000'000 + 50'000 * microBatch,
                            fit ? 0 : 4096, 0.01};
}

/// A small run as a CLI writes it: a probe that chooses 16 of a target of 256, and two steps.
std::vector<std::string> runStart() {
    core::RunSummary summary;
    summary.device = "virtual:24MiB";
    summary.model = "cnn";
    summary.targetBatch = 256;
    core::ProbeStarted started;
    started.sequence = 1;
    started.device = "virtual:24MiB";
    started.upperBound = 256;
    started.usableBytes = 24 << 20;
    core::ProbeFinished finished;
    finished.sequence = 1;
    finished.microBatch = 16;
    finished.accumulationSteps = 16;
    finished.targetBatch = 256;
    finished.trials = 3;
    return {line(core::RunStateChanged{0, core::RunState::Starting, "virtual:24MiB"}),
            line(summary),
            line(started),
            line(trial(1, 1, 8, true)),
            line(trial(1, 2, 16, true)),
            line(trial(1, 3, 32, false)),
            line(finished)};
}

std::vector<std::string> runSteps(int64_t from, int64_t to) {
    std::vector<std::string> lines;
    for (int64_t step = from; step <= to; ++step) {
        core::StepMetrics metrics;
        metrics.time = static_cast<double>(step);
        metrics.step = step;
        metrics.loss = 2.0;
        metrics.microBatch = 16;
        metrics.accumulationSteps = 16;
        metrics.targetBatch = 256;
        lines.push_back(line(metrics));
        lines.push_back(line(core::OptimizerStepped{metrics.time, step, 16}));
    }
    return lines;
}

std::string runEnd() {
    return line(core::RunStateChanged{100, core::RunState::Finished, {}});
}

/// A run folder holding `lines` as its events.jsonl.
void writeRun(const QString& folder, const std::vector<std::string>& lines) {
    std::ofstream out(QDir(folder).filePath(QStringLiteral("events.jsonl")).toStdString(), std::ios::binary);
    for (const std::string& text : lines) out << text << '\n';
}

bool logSays(const ui::MainWindow& w, const QString& text) {
    const QAbstractItemModel* log = w.eventLog()->model();
    for (int row = 0; row < log->rowCount(); ++row)
        for (int column = 0; column < log->columnCount(); ++column)
            if (log->index(row, column).data().toString().contains(text)) return true;
    return false;
}

/// The process's resident memory in bytes (Linux).
qint64 residentBytes() {
    QFile status(QStringLiteral("/proc/self/status"));
    if (!status.open(QIODevice::ReadOnly)) return 0;
    for (const QByteArray& row : status.readAll().split('\n'))
        if (row.startsWith("VmRSS:")) return row.mid(6).trimmed().split(' ').front().toLongLong() * 1024;
    return 0;
}

/// Opens `folder` in `w` and waits until everything in it was delivered; the milliseconds it took,
/// -1 past kCatchUp.
qint64 openAndCatchUp(ui::MainWindow& w, const QString& folder) {
    QElapsedTimer clock;
    clock.start();
    if (!w.openRun(folder)) return -1;
    if (!QTest::qWaitFor([&] { return w.watcher()->caughtUp(); }, kCatchUp)) return -1;
    return clock.elapsed() <= kCatchUp ? clock.elapsed() : -1;
}

// ── A server that lies ─────────────────────────────────────────────────────────────────────────

/// Gzip of `bytes` spaces (valid JSON whitespace inflated): a few hundred KiB for hundreds of MiB.
std::string gzipOfSpaces(size_t bytes) {
    z_stream z{};
    if (deflateInit2(&z, 9, Z_DEFLATED, /*gzip=*/15 + 16, 9, Z_DEFAULT_STRATEGY) != Z_OK) return {};
    const std::string spaces(size_t{1} << 20, ' ');
    std::string out;
    std::vector<char> buffer(size_t{1} << 16);
    for (size_t left = bytes; left > 0 || z.avail_in > 0;) {
        if (z.avail_in == 0) {
            const size_t take = std::min(left, spaces.size());
            z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(spaces.data()));
            z.avail_in = static_cast<uInt>(take);
            left -= take;
        }
        do {
            z.next_out = reinterpret_cast<Bytef*>(buffer.data());
            z.avail_out = static_cast<uInt>(buffer.size());
            deflate(&z, left == 0 && z.avail_in == 0 ? Z_FINISH : Z_NO_FLUSH);
            out.append(buffer.data(), buffer.size() - z.avail_out);
        } while (z.avail_out == 0);
    }
    int status = Z_OK;
    while (status != Z_STREAM_END) {
        z.next_out = reinterpret_cast<Bytef*>(buffer.data());
        z.avail_out = static_cast<uInt>(buffer.size());
        status = deflate(&z, Z_FINISH);
        out.append(buffer.data(), buffer.size() - z.avail_out);
        if (status != Z_OK && status != Z_STREAM_END) break;
    }
    deflateEnd(&z);
    return out;
}

/// Answers the window's requests on 127.0.0.1 as a served run would, but for one: GET /config
/// (or the event stream) sends far more than a run's answer holds, in one of the ways below.
/// Counts what it sent of that answer: a window that stopped reading makes its sending fail.
class LyingServer {
public:
    enum class Lie {
        HugeLength,     ///< /config claims a 10 GB Content-Length and sends until cut off
        EndlessChunks,  ///< /config sends chunks without end (no length)
        GzipBomb,       ///< /config is 256 MiB of JSON whitespace gzipped to a few hundred KiB
        EndlessRecord,  ///< /events sends one record of 256 MiB, then a real event
    };
    static constexpr int64_t kCap = int64_t{256} << 20;  // what a lie sends at most

    explicit LyingServer(Lie lie) : m_lie(lie) {
        if (lie == Lie::GzipBomb) m_bomb = gzipOfSpaces(static_cast<size_t>(kCap));
        m_listener = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ::bind(m_listener, reinterpret_cast<sockaddr*>(&address), sizeof address);
        ::listen(m_listener, 16);
        socklen_t length = sizeof address;
        ::getsockname(m_listener, reinterpret_cast<sockaddr*>(&address), &length);
        m_port = ntohs(address.sin_port);
        m_accepting = std::thread([this] { accept(); });
    }
    ~LyingServer() {
        m_stop = true;
        ::shutdown(m_listener, SHUT_RDWR);
        ::close(m_listener);
        m_accepting.join();
        {
            const std::lock_guard lock(m_mutex);
            for (int connection : m_connections) ::shutdown(connection, SHUT_RDWR);
        }
        for (std::thread& t : m_threads) t.join();
        for (int connection : m_connections) ::close(connection);
    }
    QUrl url() const { return QUrl(QStringLiteral("http://127.0.0.1:%1/?token=abc").arg(m_port)); }
    /// Bytes of the lie sent so far.
    int64_t sent() const { return m_sent; }
    /// The lie is over: sent whole, or the window stopped taking it.
    bool done() const { return m_done; }

private:
    void accept() {
        while (!m_stop) {
            const int connection = ::accept(m_listener, nullptr, nullptr);
            if (connection < 0) return;
            timeval timeout{1, 0};
            ::setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
            const std::lock_guard lock(m_mutex);
            m_connections.push_back(connection);
            m_threads.emplace_back([this, connection] { serve(connection); });
        }
    }
    /// Sends all of `data`; false once the window has closed the connection (or on stop).
    bool send(int connection, const char* data, size_t size) {
        while (size > 0 && !m_stop) {
            const ssize_t n = ::send(connection, data, size, MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
                return false;
            }
            data += n;
            size -= static_cast<size_t>(n);
        }
        return size == 0;
    }
    bool send(int connection, const std::string& text) { return send(connection, text.data(), text.size()); }
    bool lie(int connection, const std::string& text) {
        if (!send(connection, text)) return false;
        m_sent += static_cast<int64_t>(text.size());
        return true;
    }
    void serve(int connection) {
        std::string request;
        char buffer[4096];
        while (request.find("\r\n\r\n") == std::string::npos) {
            const ssize_t n = ::recv(connection, buffer, sizeof buffer, 0);
            if (n <= 0) return;
            request.append(buffer, static_cast<size_t>(n));
        }
        const std::string path = request.substr(4, request.find(' ', 4) - 4);
        const std::string json = "Content-Type: application/json\r\n";
        if (path == "/config" && m_lie != Lie::EndlessRecord) {
            lieAboutConfig(connection);
        } else if (path == "/config") {
            send(connection, "HTTP/1.1 200 OK\r\n" + json + "Content-Length: 2\r\n\r\n{}");
        } else if (path == "/events") {
            events(connection);
        } else {
            const std::string body = R"({"access":"watch"})";
            send(connection,
                 "HTTP/1.1 200 OK\r\n" + json + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
        }
    }
    void lieAboutConfig(int connection) {
        const std::string ok = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n";
        const std::string chunk(size_t{64} << 10, ' ');
        if (m_lie == Lie::HugeLength) {
            if (send(connection, ok + "Content-Length: 10000000000\r\n\r\n{"))
                while (m_sent < kCap && lie(connection, chunk)) {
                }
        } else if (m_lie == Lie::EndlessChunks) {
            if (send(connection, ok + "Transfer-Encoding: chunked\r\n\r\n"))
                while (m_sent < kCap && lie(connection, "10000\r\n" + chunk + "\r\n")) {
                }
        } else if (m_lie == Lie::GzipBomb) {
            if (send(connection,
                     ok + "Content-Encoding: gzip\r\nContent-Length: " + std::to_string(m_bomb.size()) + "\r\n\r\n"))
                lie(connection, m_bomb);
        }
        m_done = true;
    }
    void events(int connection) {
        if (!send(connection, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"))
            return;
        if (m_lie == Lie::EndlessRecord) {
            // One record far longer than any event, then a real one: the window skips the first and
            // reads the second.
            const std::string chunk(size_t{64} << 10, 'x');
            bool open = lie(connection, "id: 1\ndata: ");
            while (open && m_sent < kCap) open = lie(connection, chunk);
            if (open) open = send(connection, "\n\nid: 2\ndata: " + line(core::Warning{1.0, "after the lie"}) + "\n\n");
            m_done = true;
        }
        // Then, as a live run between events: a comment now and then, until the window goes.
        while (!m_stop && send(connection, ":\n\n")) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }

    Lie m_lie;
    std::string m_bomb;
    int m_listener = -1;
    int m_port = 0;
    std::atomic<bool> m_stop = false;
    std::atomic<bool> m_done = false;
    std::atomic<int64_t> m_sent = 0;
    std::mutex m_mutex;
    std::vector<int> m_connections;
    std::vector<std::thread> m_threads;
    std::thread m_accepting;
};

}  // namespace

class TestHostileRuns : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void impossibleNumbersAreRefused_data() {
        QTest::addColumn<QString>("claim");
        QTest::addColumn<QString>("message");
        core::StepMetrics target;
        target.step = 3;
        target.microBatch = 16;
        target.accumulationSteps = 16;
        target.targetBatch = kTooMuch;  // aborted the window (a plan of 2^63 sizes)
        QTest::newRow("a target of 2^63-1 samples")
            << QString::fromStdString(line(target))
            << QStringLiteral("step \"target_batch\": 9223372036854775807 cannot be a number of samples");
        core::StepMetrics step = target;
        step.targetBatch = 256;
        step.step = kTooMuch;
        QTest::newRow("step 2^63-1") << QString::fromStdString(line(step))
                                     << QStringLiteral(
                                            "step \"step\": 9223372036854775807 cannot be an optimizer step");
        QTest::newRow("a negative step") << QString::fromStdString(line(core::OptimizerStepped{3, -1, 16}))
                                         << QStringLiteral("optimizer_step \"step\": -1 cannot be an optimizer step");
        QTest::newRow("a share beyond the largest batch")
            << QString::fromStdString(line(ranksStepped(3, {rankStep(0, 128, 16), rankStep(1, kLargest + 1, 1)})))
            << QStringLiteral("ranks_step \"ranks[1].share\": 2147483649 cannot be a number of samples");
        std::vector<core::RankStep> ranks;
        for (int r = 0; r < 4096; ++r) ranks.push_back(rankStep(r, 64, 16));
        QTest::newRow("4,096 ranks") << QString::fromStdString(line(ranksStepped(3, ranks)))
                                     << QStringLiteral("ranks_step \"ranks\": 4096 ranks, more than a run can have");
        QTest::newRow("rank 4,096") << QString::fromStdString(
                                           line(core::DeviceSwitched{3, "cpu", "virtual:1GiB", 4096}))
                                    << QStringLiteral("device_switch \"rank\": 4096 cannot be a rank (0 to 255)");
        QTest::newRow("trial 100,000") << QString::fromStdString(line(trial(1, 100'000, 16, true)))
                                       << QStringLiteral(
                                              "probe_trial \"trial\": 100000 cannot be a probe's trial count");
        core::ProbeFinished finished;
        finished.sequence = 1;
        finished.microBatch = 16;
        finished.trials = 100'000;
        QTest::newRow("a probe of 100,000 trials")
            << QString::fromStdString(line(finished))
            << QStringLiteral("probe_finished \"trials\": 100000 cannot be a probe's trial count");
        core::EquivalenceChecked check;
        check.samples = 64;
        check.rankMicroBatchSizes = {{32, 32}, {-5}};
        check.rankDevices = {"cpu", "cpu"};
        QTest::newRow("a negative micro-batch of a rank")
            << QString::fromStdString(line(check))
            << QStringLiteral("equivalence \"ranks[1].micro_batch_sizes[0]\": -5 cannot be a number of samples");
    }
    void impossibleNumbersAreRefused() {
        // The claim after the steps of an ordinary run (the last word on its plan): it is skipped
        // and said, the rest is shown.
        QFETCH(QString, claim);
        QFETCH(QString, message);
        QTemporaryDir folder;
        std::vector<std::string> lines = runStart();
        for (const std::string& text : runSteps(1, 4)) lines.push_back(text);
        lines.push_back(claim.toStdString());
        lines.push_back(runEnd());
        writeRun(folder.path(), lines);
        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        QVERIFY(openAndCatchUp(w, folder.path()) >= 0);
        QVERIFY(!w.grab().isNull());  // every view draws what it holds
        QCOMPARE(w.watcher()->skippedLines(), qint64{1});
        QVERIFY2(logSays(w, QStringLiteral("line %1: %2").arg(runStart().size() + 9).arg(message)),
                 qPrintable(message));
        QCOMPARE(w.runModel()->steps(), qint64{4});
        QCOMPARE(w.runModel()->plan().targetBatch, qint64{256});
    }

    void theLargestShareCostsNoTimeInProportion() {
        // Two ranks, the second with the largest share a run can have at a micro-batch of 1: 2^31
        // micro-batches, which the window counts and draws per pixel, never one by one (the bar
        // drew a line per micro-batch: over a minute; the what-if row listed 2^31 sizes).
        QTemporaryDir folder;
        std::vector<std::string> lines = runStart();
        for (const std::string& text : runSteps(1, 2)) lines.push_back(text);
        core::StepMetrics largest;
        largest.step = 3;
        largest.microBatch = 1;
        largest.accumulationSteps = kLargest;
        largest.targetBatch = kLargest;
        lines.push_back(line(largest));
        lines.push_back(line(ranksStepped(3, {rankStep(0, 16, 16), rankStep(1, kLargest, 1)})));
        writeRun(folder.path(), lines);
        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        QVERIFY(openAndCatchUp(w, folder.path()) >= 0);
        QCOMPARE(w.watcher()->skippedLines(), qint64{0});
        QElapsedTimer clock;
        clock.start();
        QVERIFY(!w.accumulationView()->grab().isNull());
        QVERIFY(!w.ranksView()->grab().isNull());
        QVERIFY(!w.grab().isNull());
        QVERIFY2(clock.elapsed() < kDrawn, qPrintable(QStringLiteral("drawn in %1 ms").arg(clock.elapsed())));
        // The share's bar says what it is, and fills its part of the batch.
        auto* table = w.ranksView()->findChild<QTableWidget*>(QStringLiteral("ranksTable"));
        QVERIFY(table != nullptr);
        QCOMPARE(table->rowCount(), 2);
        auto* bar = qobject_cast<QProgressBar*>(table->cellWidget(1, 2));
        QVERIFY(bar != nullptr);
        QCOMPARE(bar->text(), QStringLiteral("2147483648 of 2147483664 samples"));
        QVERIFY2(bar->value() > bar->minimum() && bar->value() <= bar->maximum(),
                 qPrintable(QStringLiteral("%1 of %2..%3").arg(bar->value()).arg(bar->minimum()).arg(bar->maximum())));
        QVERIFY(w.accumulationView()->caption().contains(QStringLiteral("rank 1: 2147483648")));
    }

    void manyTrialsCostBoundedTime_data() {
        QTest::addColumn<int>("probes");
        QTest::addColumn<int>("trialsEach");
        // One probe that claims 100,000 trials (numbers 1 to 1,000 over and over: each line is
        // possible, the count is not), and a run that re-probed 100 times at the most trials each.
        QTest::newRow("one probe, 100,000 trials") << 1 << 100'000;
        QTest::newRow("100 probes of 1,000 trials") << 100 << 1000;
    }
    void manyTrialsCostBoundedTime() {
        QFETCH(int, probes);
        QFETCH(int, trialsEach);
        QTemporaryDir folder;
        std::vector<std::string> lines = runStart();
        for (int p = 2; p < probes + 2; ++p) {
            core::ProbeStarted started;
            started.sequence = p;
            started.reason = core::ProbeReason::Regrow;
            started.upperBound = 4096;
            lines.push_back(line(started));
            for (int t = 0; t < trialsEach; ++t)
                lines.push_back(line(trial(p, t % 1000 + 1, 1 + (t * 37) % 4000, t % 3 != 0)));
            core::ProbeFinished finished;
            finished.sequence = p;
            finished.microBatch = 16;
            finished.accumulationSteps = 16;
            finished.targetBatch = 256;
            finished.trials = std::min(trialsEach, 1000);
            lines.push_back(line(finished));
        }
        lines.push_back(runEnd());
        writeRun(folder.path(), lines);
        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        const qint64 took = openAndCatchUp(w, folder.path());
        QVERIFY2(took >= 0, qPrintable(QStringLiteral("not read within %1 s").arg(kCatchUp / 1000)));
        QElapsedTimer clock;
        clock.start();
        QVERIFY(!w.grab().isNull());
        QVERIFY2(clock.elapsed() < kDrawn, qPrintable(QStringLiteral("drawn in %1 ms").arg(clock.elapsed())));
        QCOMPARE(w.watcher()->skippedLines(), qint64{0});
        QVERIFY(w.chartsPanel()->probeChart()->trialCount() > 0);
        qInfo("%d probes of %d trials: read in %lld ms", probes, trialsEach, static_cast<long long>(took));
    }

    void theMostRanksEveryStep() {
        // 256 ranks (the most a job can have) in every one of 200 steps: read within the bound.
        QTemporaryDir folder;
        std::vector<std::string> lines = runStart();
        std::vector<core::RankStep> ranks;
        for (int r = 0; r < 256; ++r) ranks.push_back(rankStep(r, 64, 16));
        for (int64_t step = 1; step <= 200; ++step) lines.push_back(line(ranksStepped(step, ranks)));
        lines.push_back(runEnd());
        writeRun(folder.path(), lines);
        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        const qint64 took = openAndCatchUp(w, folder.path());
        QVERIFY2(took >= 0, qPrintable(QStringLiteral("not read within %1 s").arg(kCatchUp / 1000)));
        QVERIFY(!w.grab().isNull());
        QCOMPARE(w.watcher()->skippedLines(), qint64{0});
        auto* table = w.ranksView()->findChild<QTableWidget*>(QStringLiteral("ranksTable"));
        QVERIFY(table != nullptr);
        QCOMPARE(table->rowCount(), 256);
        qInfo("200 steps of 256 ranks: read in %lld ms", static_cast<long long>(took));
    }

    void aServerThatSendsTooMuchIsCutOff_data() {
        QTest::addColumn<int>("lie");
        QTest::addColumn<QString>("message");
        QTest::newRow("a 10 GB Content-Length")
            << static_cast<int>(LyingServer::Lie::HugeLength) << QStringLiteral("configuration is refused");
        QTest::newRow("an endless configuration")
            << static_cast<int>(LyingServer::Lie::EndlessChunks) << QStringLiteral("configuration is refused");
        QTest::newRow("a gzip bomb") << static_cast<int>(LyingServer::Lie::GzipBomb)
                                     << QStringLiteral("configuration is refused");
        QTest::newRow("an endless event")
            << static_cast<int>(LyingServer::Lie::EndlessRecord) << QStringLiteral("longer than 16 MiB");
    }
    void aServerThatSendsTooMuchIsCutOff() {
        QFETCH(int, lie);
        QFETCH(QString, message);
        const auto kind = static_cast<LyingServer::Lie>(lie);
        LyingServer server(kind);
        ui::MainWindow w;
        w.show();
        QSignalSpy configurations(w.remote(), &ui::RemoteRun::configurationReceived);
        const qint64 before = residentBytes();
        QVERIFY(w.connectToRun(server.url()));
        QTRY_VERIFY_WITH_TIMEOUT(logSays(w, message), kCatchUp);
        QTRY_VERIFY_WITH_TIMEOUT(server.done(), kCatchUp);
        if (kind == LyingServer::Lie::EndlessRecord) {
            // The event after the lie is read: the stream goes on.
            QTRY_VERIFY_WITH_TIMEOUT(logSays(w, QStringLiteral("after the lie")), kCatchUp);
        } else {
            QCOMPARE(configurations.count(), 0);
            // Cut off: the window stopped reading long before the server stopped sending.
            QVERIFY2(server.sent() < LyingServer::kCap,
                     qPrintable(QStringLiteral("the window took %1 bytes").arg(server.sent())));
        }
        const qint64 grown = residentBytes() - before;
        qInfo("the server sent %lld bytes of its answer; the window grew by %lld MiB",
              static_cast<long long>(server.sent()), static_cast<long long>(grown >> 20));
        // Under a sanitizer freed memory waits in its quarantine (256 MiB by default) before reuse.
        const int64_t bound = (int64_t{100} << 20) + (kSanitizerSlowdown > 1 ? int64_t{400} << 20 : 0);
        QVERIFY2(grown < bound, qPrintable(QStringLiteral("grew by %1 MB").arg(grown >> 20)));
        w.closeRun();
    }
};

}  // namespace tst_hostile_runs

BATCHPILOT_TEST_MAIN(tst_hostile_runs::TestHostileRuns)
#include "tst_hostile_runs.moc"
