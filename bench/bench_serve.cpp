// A run served by `batchpilot-cli --serve`, watched by a connected window (offscreen): the events
// per second the stream carries into the window's views, and what a connected window costs the
// run it watches (samples/s with a window connected against none, paired).
//
// The stream: a CLI run that writes an event per micro-batch (a tiny MLP at micro-batch 2) is
// paused once it has written N events; a window then connects and the time until all N are in
// its views gives the stream's catch-up rate. Then the run resumes with the window live, and the
// window's lag behind the run is measured as the run goes on at its own rate.
//
// The cost: the same run (--threads 1, a fixed number of steps) not served, served with no
// client, served to a client that reads the stream (a remote window's cost to the run), and
// served to a window on this machine (which also takes this machine's cores), and served while
// attacked as the security test attacks it (idle connections, malformed requests, a slow drip;
// from this machine, so the attack takes CPU too), in rotated turns;
// samples/s over the steps after the probe, from each run's own step events.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <QApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QProcess>
#include <QTemporaryDir>
#include <QUrl>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "bench/gui_bench.h"
#include "ui/session/remote_run.h"
#include "ui/window/main_window.h"

namespace {

using namespace batchpilot;
using nlohmann::json;

struct Served {
    QString folder;
    int port = 0;
    std::string url;
    std::string token;
};

/// Starts `batchpilot-cli ARGS --runs-dir RUNS` (with `--serve 0` when `serve`) and waits for
/// its run folder (and serve.json).
bool startRun(QProcess& cli, const QString& runs, const QStringList& args, Served& served, bool serve = true) {
    cli.setStandardOutputFile(QProcess::nullDevice());
    cli.setStandardErrorFile(QProcess::nullDevice());  // the URLs it prints; the bench checks the run itself
    QStringList all = args + QStringList{QStringLiteral("--quiet"), QStringLiteral("--runs-dir"), runs};
    if (serve) all += QStringList{QStringLiteral("--serve"), QStringLiteral("0")};
    cli.start(QStringLiteral(BATCHPILOT_CLI_PATH), all);
    if (!cli.waitForStarted()) return false;
    QElapsedTimer clock;
    clock.start();
    while (clock.elapsed() < 120'000 && cli.state() == QProcess::Running) {
        const QStringList folders = QDir(runs).entryList(QDir::Dirs | QDir::NoDotAndDotDot);
        if (folders.size() == 1) {
            served.folder = QDir(runs).filePath(folders.front());
            if (!serve) return true;
            std::ifstream in(QDir(served.folder).filePath(QStringLiteral("serve.json")).toStdString());
            const json j = json::parse(in, nullptr, false);
            if (j.is_object()) {
                served.url = j.at("url");
                served.port = std::stoi(served.url.substr(served.url.rfind(':') + 1));
                served.token = served.url.substr(served.url.find("token=") + 6);
                return true;
            }
        }
        bench::spin(20);
    }
    return false;
}

httplib::Headers bearer(const std::string& token) {
    return {{"Authorization", "Bearer " + token}};
}

/// The number of events the server holds (GET /), -1 when it does not answer.
int64_t servedEvents(const Served& served) {
    httplib::Client client("127.0.0.1", served.port);
    const auto answer = client.Get("/", bearer(served.token));
    if (!answer || answer->status != 200) return -1;
    const json j = json::parse(answer->body, nullptr, false);
    return j.is_object() ? j.value("events", int64_t{-1}) : -1;
}

bool command(const Served& served, const std::string& body) {
    httplib::Client client("127.0.0.1", served.port);
    const auto answer = client.Post("/command", bearer(served.token), body, "application/json");
    return answer && answer->status == 200;
}

void stopRun(QProcess& cli, const Served& served) {
    command(served, R"({"command":"stop"})");
    QElapsedTimer clock;
    clock.start();
    while (cli.state() != QProcess::NotRunning && clock.elapsed() < 60'000) bench::spin(50);
    if (cli.state() != QProcess::NotRunning) cli.kill();
    cli.waitForFinished(10'000);
}

/// A window connected to the served run, counting the events its views were given.
struct ConnectedWindow {
    ui::MainWindow window;
    int64_t delivered = 0;

    explicit ConnectedWindow(const Served& served) {
        window.resize(1280, 800);
        window.show();
        QObject::connect(window.remote(), &ui::RemoteRun::eventsReceived,
                         [this](const QList<core::Event>& events) { delivered += events.size(); });
        window.connectToRun(QUrl(QString::fromStdString(served.url)));
    }
};

/// Samples per second over the run's steps after `skipSteps`, from its events.jsonl.
double samplesPerSecond(const QString& folder, int64_t skipSteps) {
    std::ifstream in(QDir(folder).filePath(QStringLiteral("events.jsonl")).toStdString());
    double firstTime = -1, lastTime = -1;
    int64_t firstSamples = 0, lastSamples = 0;
    for (std::string line; std::getline(in, line);) {
        if (line.find("\"type\":\"step\"") == std::string::npos) continue;
        const json j = json::parse(line, nullptr, false);
        if (!j.is_object() || j.value("step", int64_t{0}) < skipSteps) continue;
        if (firstTime < 0) {
            firstTime = j.at("time");
            firstSamples = j.at("samples_seen");
        }
        lastTime = j.at("time");
        lastSamples = j.at("samples_seen");
    }
    return lastTime > firstTime ? static_cast<double>(lastSamples - firstSamples) / (lastTime - firstTime) : 0;
}

json streamRate(int64_t events, std::vector<std::string>& rows) {
    const QStringList args{QStringLiteral("--model"),
                           QStringLiteral("mlp"),
                           QStringLiteral("--width"),
                           QStringLiteral("8"),
                           QStringLiteral("--device"),
                           QStringLiteral("cpu"),
                           QStringLiteral("--target-batch"),
                           QStringLiteral("256"),
                           QStringLiteral("--max-micro-batch"),
                           QStringLiteral("2"),
                           QStringLiteral("--samples"),
                           QStringLiteral("4096"),
                           QStringLiteral("--steps"),
                           QStringLiteral("1000000"),
                           QStringLiteral("--validation-split"),
                           QStringLiteral("0"),
                           QStringLiteral("--threads"),
                           QStringLiteral("1")};
    QTemporaryDir runs;
    QProcess cli;
    Served served;
    if (!startRun(cli, runs.path(), args, served)) {
        std::fprintf(stderr, "batchpilot-bench-serve: the CLI did not start serving\n");
        return {{"error", "the CLI did not start serving"}};
    }
    // The run writes its events; paused once it has N, it holds still.
    while (servedEvents(served) < events && cli.state() == QProcess::Running) bench::spin(200);
    command(served, R"({"command":"pause"})");
    int64_t held = -1;
    for (int64_t now = servedEvents(served); now != held; now = servedEvents(served)) {
        held = now;
        bench::spin(1000);
    }

    // Catch-up: a window connects and is given every event the run wrote.
    ConnectedWindow connected(served);
    bench::LatencyProbe latency;
    latency.arm();
    QElapsedTimer clock;
    clock.start();
    while (connected.delivered < held && clock.elapsed() < 600'000)
        QApplication::processEvents(QEventLoop::AllEvents, 20);
    const double catchUpSeconds = static_cast<double>(clock.nsecsElapsed()) / 1e9;
    latency.stop();
    const double catchUpRate = static_cast<double>(connected.delivered) / catchUpSeconds;
    const double p99 = bench::percentile(latency.samples, 99);

    // Live: the run resumes; the window follows it for 10 s.
    command(served, R"({"command":"resume"})");
    const int64_t liveStart = servedEvents(served);
    const int64_t deliveredStart = connected.delivered;
    bench::LatencyProbe liveLatency;
    liveLatency.arm();
    QElapsedTimer live;
    live.start();
    bench::spin(10'000);
    const int64_t produced = servedEvents(served) - liveStart;
    const int64_t followed = connected.delivered - deliveredStart;
    const double liveSeconds = static_cast<double>(live.nsecsElapsed()) / 1e9;
    liveLatency.stop();
    // The lag: events the server held that the window had not yet shown, when the 10 s ended.
    const int64_t lag = std::max<int64_t>(0, produced - followed);
    stopRun(cli, served);

    json result = {{"events", held},
                   {"catch_up_seconds", catchUpSeconds},
                   {"catch_up_events_per_second", catchUpRate},
                   {"catch_up_latency_p99_ms", p99},
                   {"live_seconds", liveSeconds},
                   {"live_events_per_second_produced", static_cast<double>(produced) / liveSeconds},
                   {"live_events_per_second_shown", static_cast<double>(followed) / liveSeconds},
                   {"live_lag_events", lag},
                   {"live_latency_p99_ms", bench::percentile(liveLatency.samples, 99)}};
    rows.push_back(std::to_string(held) + "," + bench::fixed(catchUpSeconds, 2) + "," + bench::fixed(catchUpRate, 0) +
                   "," + bench::fixed(p99, 1) + "," + bench::fixed(static_cast<double>(produced) / liveSeconds, 0) +
                   "," + bench::fixed(static_cast<double>(followed) / liveSeconds, 0) + "," + std::to_string(lag));
    std::printf(
        "stream: %lld events caught up in %.2f s (%.0f events/s into the views, GUI p99 %.1f ms); live: run %.0f "
        "events/s, window %.0f events/s, %lld behind after %.0f s\n",
        static_cast<long long>(held), catchUpSeconds, catchUpRate, p99, static_cast<double>(produced) / liveSeconds,
        static_cast<double>(followed) / liveSeconds, static_cast<long long>(lag), liveSeconds);
    std::fflush(stdout);
    return result;
}

enum class Arm { NotServed, Served, Streamed, Watched, Attacked };
constexpr int kArms = 5;

int rawConnection(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

/// What the tests send, kept up for a whole run: 600 connections that say nothing (re-opened as
/// the server closes them), a request sent a byte every 300 ms (re-opened when cut), a head of
/// endless header lines, 1 MiB of noise sent and the connection dropped (twice a second), and
/// 1,000 malformed requests a second. From this machine, so the attack also takes CPU from the
/// run. Meanwhile a legitimate client asks GET / with its token on a fresh connection every 200 ms:
/// its slowest answer and its failures are what the attack costs the people using the server.
class Attacker {
public:
    Attacker(int port, std::string token)
        : m_prober([this, port, token] {
              while (!m_stop) {
                  httplib::Client client("127.0.0.1", port);
                  client.set_connection_timeout(std::chrono::seconds(5));
                  client.set_read_timeout(std::chrono::seconds(5));
                  const auto began = std::chrono::steady_clock::now();
                  const auto answer = client.Get("/", bearer(token));
                  const double ms =
                      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
                  if (!answer || answer->status != 200) {
                      ++m_failed;
                      const std::lock_guard lock(m_reasonsMutex);
                      ++m_reasons[answer ? "status " + std::to_string(answer->status)
                                         : "error " + httplib::to_string(answer.error())];
                  }
                  m_slowestMs = std::max(m_slowestMs.load(), ms);
                  ++m_asked;
                  std::this_thread::sleep_for(std::chrono::milliseconds(200));
              }
          }),
          m_thread([this, port] {
              std::vector<int> idle(600, -1);
              int drip = -1;
              int flood = -1;
              auto nextDrip = std::chrono::steady_clock::now();
              auto nextNoise = std::chrono::steady_clock::now();
              int64_t sent = 0;
              const auto start = std::chrono::steady_clock::now();
              const std::string garbage[] = {"GET / HTTP/9.9\r\n\r\n", "\x01\x02\x03\r\n\r\n",
                                             "POST /command HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
                                             "POST /command HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"};
              std::string noise(1 << 20, '\0');
              uint32_t state = 1;
              for (char& c : noise) c = static_cast<char>((state = state * 1664525u + 1013904223u) >> 24);
              while (!m_stop) {
                  for (int& fd : idle) {
                      char byte = 0;
                      if (fd >= 0 && ::recv(fd, &byte, 1, MSG_DONTWAIT) == 0) {
                          ::close(fd);
                          fd = -1;
                      }
                      if (fd < 0) fd = rawConnection(port);
                  }
                  if (std::chrono::steady_clock::now() >= nextDrip) {
                      const char byte = 'z';
                      if (drip < 0) {
                          drip = rawConnection(port);
                          if (drip >= 0) (void)!::send(drip, "GET / HTTP/1.1\r\nX-Slow: ", 25, MSG_NOSIGNAL);
                      } else if (::send(drip, &byte, 1, MSG_NOSIGNAL) != 1) {
                          ::close(drip);
                          drip = -1;
                      }
                      nextDrip += std::chrono::milliseconds(300);
                  }
                  if (flood < 0) {
                      flood = rawConnection(port);
                      if (flood >= 0) (void)!::send(flood, "GET / HTTP/1.1\r\n", 16, MSG_NOSIGNAL);
                  } else {
                      const std::string lines = "X-A: b\r\nX-C: d\r\nX-E: f\r\nX-G: h\r\n";
                      if (::send(flood, lines.data(), lines.size(), MSG_NOSIGNAL | MSG_DONTWAIT) <= 0 &&
                          errno != EAGAIN) {
                          ::close(flood);
                          flood = -1;
                      }
                  }
                  if (std::chrono::steady_clock::now() >= nextNoise) {
                      if (const int fd = rawConnection(port); fd >= 0) {
                          (void)!::send(fd, noise.data(), noise.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
                          ::close(fd);
                      }
                      nextNoise += std::chrono::milliseconds(500);
                  }
                  // 1,000 malformed requests a second, in bursts of 50.
                  for (int i = 0; i < 50; ++i, ++sent) {
                      const int fd = rawConnection(port);
                      if (fd < 0) continue;
                      const std::string& text = garbage[sent % 4];
                      (void)!::send(fd, text.data(), text.size(), MSG_NOSIGNAL);
                      ::close(fd);
                  }
                  std::this_thread::sleep_until(start + std::chrono::milliseconds(sent));
              }
              for (const int fd : idle)
                  if (fd >= 0) ::close(fd);
              if (drip >= 0) ::close(drip);
              if (flood >= 0) ::close(flood);
              m_malformed = sent;
          }) {}
    struct Outcome {
        int64_t malformed = 0;
        int64_t asked = 0;   ///< the legitimate client's requests
        int64_t failed = 0;  ///< of them, unanswered or not 200
        double slowestMs = 0;
        std::string failures;  ///< why they failed: "status 503 x2; error Read x1"
    };
    Outcome finish() {
        m_stop = true;
        m_thread.join();
        m_prober.join();
        std::string failures;
        for (const auto& [why, count] : m_reasons)
            failures += (failures.empty() ? "" : "; ") + why + " x" + std::to_string(count);
        return {m_malformed, m_asked, m_failed, m_slowestMs, failures};
    }

private:
    std::atomic<bool> m_stop{false};
    int64_t m_malformed = 0;
    std::atomic<int64_t> m_asked{0};
    std::atomic<int64_t> m_failed{0};
    std::atomic<double> m_slowestMs{0};
    std::mutex m_reasonsMutex;
    std::map<std::string, int> m_reasons;  ///< the legitimate client's failures, by why
    std::thread m_prober;
    std::thread m_thread;
};

/// A client that reads the event stream and throws it away: what serving a remote window costs
/// the run, without the window's own work on this machine's cores.
class StreamReader {
public:
    explicit StreamReader(const Served& served)
        : m_thread([this, served] {
              httplib::Client client("127.0.0.1", served.port);
              client.set_read_timeout(std::chrono::seconds(60));
              client.Get("/events", bearer(served.token), [this](const char* data, size_t length) {
                  for (size_t i = 0; i < length; ++i) m_events += data[i] == '\n' && m_previousNewline;
                  m_previousNewline = length > 0 && data[length - 1] == '\n';
                  return true;
              });
          }) {}
    /// Joins once the run's stream ended. The number of records read (blank-line ends).
    int64_t finish() {
        m_thread.join();
        return m_events;
    }

private:
    int64_t m_events = 0;
    bool m_previousNewline = false;
    std::thread m_thread;
};

struct Setup {
    const char* name;
    QStringList args;
};

/// The runs the cost is measured on: a CNN (a few events per step), and a tiny MLP at
/// micro-batch 2 (an event per micro-batch: the stream at its busiest).
std::vector<Setup> costSetups(bool quick) {
    const QString steps = QString::number(quick ? 20 : 60);
    const QStringList common{QStringLiteral("--samples"),          QStringLiteral("4096"),
                             QStringLiteral("--validation-split"), QStringLiteral("0"),
                             QStringLiteral("--threads"),          QStringLiteral("1")};
    return {{"cnn, virtual:64MiB/exact, target 256",
             QStringList{QStringLiteral("--model"), QStringLiteral("cnn"), QStringLiteral("--device"),
                         QStringLiteral("virtual:64MiB/exact"), QStringLiteral("--target-batch"), QStringLiteral("256"),
                         QStringLiteral("--steps"), steps} +
                 common},
            {"mlp width 8, micro-batch 2, target 256",
             QStringList{QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--width"),
                         QStringLiteral("8"), QStringLiteral("--device"), QStringLiteral("cpu"),
                         QStringLiteral("--target-batch"), QStringLiteral("256"), QStringLiteral("--max-micro-batch"),
                         QStringLiteral("2"), QStringLiteral("--steps"), QString::number(quick ? 40 : 120)} +
                 common}};
}

/// One run — not served, served with no client, or served to a connected window: its samples/s
/// after the probe (0 when it failed).
double timedRun(const Setup& setup, Arm arm, int64_t* shown, Attacker::Outcome* attack) {
    QTemporaryDir runs;
    QProcess cli;
    Served served;
    if (!startRun(cli, runs.path(), setup.args, served, arm != Arm::NotServed)) return 0;
    std::unique_ptr<ConnectedWindow> window;
    std::unique_ptr<StreamReader> reader;
    if (arm == Arm::Watched) window = std::make_unique<ConnectedWindow>(served);
    std::unique_ptr<Attacker> attacker;
    if (arm == Arm::Streamed) reader = std::make_unique<StreamReader>(served);
    if (arm == Arm::Attacked) attacker = std::make_unique<Attacker>(served.port, served.token);
    QElapsedTimer clock;
    clock.start();
    while (cli.state() != QProcess::NotRunning && clock.elapsed() < 600'000) bench::spin(50);
    if (window) {
        bench::spin(500);  // the stream's last events
        *shown = window->delivered;
    }
    if (reader) *shown = reader->finish();
    if (attacker) {
        *attack = attacker->finish();
        *shown = attack->malformed;
    }
    if (cli.exitCode() != 0) return 0;
    return samplesPerSecond(served.folder, 4);
}

json clientCost(const Setup& setup, int rounds, std::vector<std::string>& rows) {
    std::vector<double> samples[kArms];
    std::vector<double> streamedOverServed, watchedOverServed, attackedOverServed, servedOverNot;
    int64_t legitimateAsked = 0, legitimateFailed = 0;
    double slowestMs = 0;
    for (int round = 0; round < rounds; ++round) {
        // The arms in a rotated order each round: none is always first or last.
        double result[kArms] = {};
        int64_t shown[kArms] = {};
        Attacker::Outcome attack;
        for (int k = 0; k < kArms; ++k) {
            const int arm = (k + round) % kArms;
            result[arm] = timedRun(setup, static_cast<Arm>(arm), &shown[arm], &attack);
            if (result[arm] <= 0) return {{"setup", setup.name}, {"error", "a run failed"}};
            samples[arm].push_back(result[arm]);
        }
        const double served = result[static_cast<int>(Arm::Served)];
        const double streamed = result[static_cast<int>(Arm::Streamed)] / served;
        const double watched = result[static_cast<int>(Arm::Watched)] / served;
        const double serving = served / result[static_cast<int>(Arm::NotServed)];
        const double attacked = result[static_cast<int>(Arm::Attacked)] / served;
        attackedOverServed.push_back(attacked);
        legitimateAsked += attack.asked;
        legitimateFailed += attack.failed;
        slowestMs = std::max(slowestMs, attack.slowestMs);
        streamedOverServed.push_back(streamed);
        watchedOverServed.push_back(watched);
        servedOverNot.push_back(serving);
        rows.push_back(std::string("\"") + setup.name + "\"," + std::to_string(round) + "," +
                       bench::fixed(result[0], 1) + "," + bench::fixed(result[1], 1) + "," +
                       bench::fixed(result[2], 1) + "," + bench::fixed(result[3], 1) + "," +
                       bench::fixed(result[4], 1) + "," + bench::fixed(streamed, 4) + "," + bench::fixed(watched, 4) +
                       "," + bench::fixed(attacked, 4) + "," + bench::fixed(serving, 4) + "," +
                       std::to_string(shown[static_cast<int>(Arm::Streamed)]) + "," +
                       std::to_string(shown[static_cast<int>(Arm::Watched)]) + "," +
                       std::to_string(shown[static_cast<int>(Arm::Attacked)]) + "," + std::to_string(attack.asked) +
                       "," + std::to_string(attack.failed) + "," + bench::fixed(attack.slowestMs, 1));
        std::printf(
            "%s, round %d: samples/s not served %.1f, served %.1f, streamed to a client %.1f (%.4f), to a window "
            "on this machine %.1f (%.4f), attacked %.1f (%.4f, %lld malformed requests; a legitimate client "
            "answered %lld of %lld, the slowest in %.1f ms%s%s); served/not %.4f\n",
            setup.name, round, result[0], result[1], result[2], streamed, result[3], watched, result[4], attacked,
            static_cast<long long>(shown[static_cast<int>(Arm::Attacked)]),
            static_cast<long long>(attack.asked - attack.failed), static_cast<long long>(attack.asked),
            attack.slowestMs, attack.failures.empty() ? "" : "; failed: ", attack.failures.c_str(), serving);
        std::fflush(stdout);
    }
    const double streamed = bench::median(streamedOverServed);
    const double watched = bench::median(watchedOverServed);
    const double serving = bench::median(servedOverNot);
    const double attacked = bench::median(attackedOverServed);
    std::printf(
        "%s, medians of %d rounds: a client reading the stream / none %.4f (goal >= 0.99); a window on this "
        "machine / none %.4f; attacked / none %.4f; served / not served %.4f\n",
        setup.name, rounds, streamed, watched, attacked, serving);
    std::fflush(stdout);
    return {{"setup", setup.name},
            {"rounds", rounds},
            {"samples_per_second_not_served", samples[0]},
            {"samples_per_second_served", samples[1]},
            {"samples_per_second_streamed", samples[2]},
            {"samples_per_second_watched", samples[3]},
            {"samples_per_second_attacked", samples[4]},
            {"attacked_over_served", attackedOverServed},
            {"median_attacked_over_served", attacked},
            {"legitimate_requests_during_attack", legitimateAsked},
            {"legitimate_requests_failed_during_attack", legitimateFailed},
            {"legitimate_slowest_ms_during_attack", slowestMs},
            {"streamed_over_served", streamedOverServed},
            {"watched_over_served", watchedOverServed},
            {"served_over_not_served", servedOverNot},
            {"median_streamed_over_served", streamed},
            {"median_watched_over_served", watched},
            {"median_served_over_not_served", serving},
            {"goal", 0.99}};
}

}  // namespace

int main(int argc, char** argv) {
    const auto args = bench::parseArgs(argc, argv, "batchpilot-bench-serve",
                                       "A served run and a connected window: stream rate and the run's cost.");
    const auto app = bench::benchApplication(argc, argv, "batchpilot-bench-serve");
    // The offscreen platform's warning about size hints, once per chart: noise here.
    qInstallMessageHandler([](QtMsgType type, const QMessageLogContext& context, const QString& message) {
        if (message.contains(QLatin1String("propagateSizeHints"))) return;
        std::fprintf(stderr, "%s\n", qPrintable(qFormatLogMessage(type, context, message)));
    });
    nlohmann::json report;
    report["bench"] = "serve";
    report["machine"] = bench::machineDescription();
    std::vector<std::string> streamRows;
    std::vector<std::string> costRows;
    report["stream"] = streamRate(args.quick ? 20'000 : 100'000, streamRows);
    for (const Setup& setup : costSetups(args.quick))
        report["client_cost"].push_back(clientCost(setup, args.quick ? 2 : 6, costRows));
    bench::writeJson(args.outDir, "serve.json", report);
    bench::writeCsv(args.outDir, "serve_stream.csv",
                    "events,catch_up_seconds,catch_up_events_per_s,catch_up_latency_p99_ms,live_produced_events_per_s,"
                    "live_shown_events_per_s,live_lag_events",
                    streamRows);
    bench::writeCsv(args.outDir, "serve_cost.csv",
                    "setup,round,samples_per_s_not_served,samples_per_s_served,samples_per_s_streamed,"
                    "samples_per_s_window,samples_per_s_attacked,streamed_over_served,window_over_served,"
                    "attacked_over_served,served_over_not_served,events_streamed,events_shown,malformed_requests,"
                    "legitimate_requests,legitimate_failed,legitimate_slowest_ms",
                    costRows);
    return 0;
}
