// batchpilot-bench-gui: the real main window (offscreen) under a synthetic event stream. A
// producer thread plays the trainer at a fixed rate into a mutex-protected queue; a 33 ms timer
// on the GUI thread drains it and emits TrainerController::eventsReceived, the signal the
// controller's own drain emits and the window listens to. Reports event-loop latency (lateness
// of a 10 ms timer), chart repaints per second and resident memory; then a million loss points:
// store size, memory growth and redraw time. Writes gui.json, gui.csv (per rate), gui_million.csv
// and gui_latency.csv (every latency sample).
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <QApplication>
#include <QTemporaryDir>
#include <QElapsedTimer>
#include <QEventLoop>
#include <QGraphicsView>
#include <QStandardPaths>
#include <QTimer>

#include "bench/bench_util.h"
#include "bench/gui_bench.h"
#include "ui/charts/charts_panel.h"
#include "ui/charts/live_chart.h"
#include "ui/charts/loss_chart.h"
#include "ui/charts/series_store.h"
#include "core/events/event_file.h"
#include "core/events/event_json.h"
#include "ui/session/run_watcher.h"
#include "ui/window/main_window.h"
#include "ui/session/trainer_controller.h"

namespace {

using namespace batchpilot;
using Clock = std::chrono::steady_clock;

constexpr int kDrainMs = 33;  // TrainerController's drain interval
constexpr int64_t kMicroBatches = 8;
constexpr int64_t kMicroBatch = 32;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kCapacity = 96 * kMiB;  // the synthetic run's virtual GPU
constexpr int64_t kUsable = kCapacity * 95 / 100;

/// Event `index` of an endless synthetic run: per optimizer step, 8 micro-batches done, two
/// memory samples, the step and its metrics (12 events), as the trainer sends them.
core::Event syntheticEvent(int64_t index, double time) {
    const int64_t step = index / 12 + 1;
    const int64_t slot = index % 12;
    const double loss =
        0.1 + 2.2 * std::exp(-static_cast<double>(step) / 4000.0) + 0.05 * std::sin(static_cast<double>(step) * 0.37);
    if (slot < kMicroBatches) {
        return core::MicroBatchDone{
            time, step,  slot, slot * kMicroBatch, kMicroBatch, kMicroBatches * kMicroBatch, 1.0 / kMicroBatches,
            loss, false, {}};
    }
    if (slot < 10) {
        const int64_t allocated = (40 + (slot == 8 ? 30 : 5)) * kMiB;
        return core::MemorySample{time, allocated, allocated, allocated, kCapacity, kUsable};
    }
    if (slot == 10) return core::OptimizerStepped{time, step, kMicroBatches};
    return core::StepMetrics{time, step,        step / 32,     step * kMicroBatches * kMicroBatch,
                             loss, kMicroBatch, kMicroBatches, kMicroBatches * kMicroBatch,
                             0.05, 2500.0,      0.1,           70 * kMiB,
                             0};
}

/// A run that just finished probing: what the charts see before the stream.
QList<core::Event> preamble() {
    QList<core::Event> events;
    events.append(core::RunStateChanged{0, core::RunState::Starting, "virtual:96MiB"});
    events.append(core::ProbeStarted{0.01, 1, core::ProbeReason::Initial, "virtual:96MiB", 256, kUsable, kMiB});
    const int64_t sizes[] = {1, 2, 4, 32, 64, 48};
    for (int i = 0; i < 6; ++i) {
        const bool fit = sizes[i] != 64;
        events.append(core::ProbeTrial{0.02 + 0.01 * i, 1, i + 1, sizes[i], fit, fit, (20 + sizes[i]) * kMiB,
                                       fit ? 0 : 4 * kMiB, 0.01});
    }
    events.append(core::ProbeFinished{0.1, 1, 48, 6, 256, 6, 0.09, false, 20.0 * kMiB, static_cast<double>(kMiB)});
    events.append(core::RunStateChanged{0.1, core::RunState::Training, "micro-batch 48"});
    return events;
}

/// The trainer's side: events at a fixed rate into a queue, like TrainerController's EventQueue.
class EventSource {
public:
    ~EventSource() { stop(); }
    void start(double rate, int64_t firstIndex) {
        m_stop = false;
        m_thread = std::thread([this, rate, firstIndex] {
            const auto started = Clock::now();
            int64_t produced = 0;
            while (!m_stop) {
                const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
                const auto due = static_cast<int64_t>(rate * elapsed);
                {
                    const std::lock_guard lock(m_mutex);
                    for (; produced < due; ++produced)
                        m_events.push_back(syntheticEvent(firstIndex + produced, elapsed));
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            m_produced = produced;
        });
    }
    /// Stops producing; returns the number of events produced.
    int64_t stop() {
        m_stop = true;
        if (m_thread.joinable()) m_thread.join();
        return m_produced;
    }
    std::vector<core::Event> take() {
        std::vector<core::Event> out;
        const std::lock_guard lock(m_mutex);
        out.swap(m_events);
        return out;
    }

private:
    std::thread m_thread;
    std::atomic<bool> m_stop{false};
    std::atomic<int64_t> m_produced{0};
    std::mutex m_mutex;
    std::vector<core::Event> m_events;
};

/// Emits a batch of events through the controller's signal, as its drain does.
void deliver(ui::MainWindow& window, std::vector<core::Event> events) {
    if (events.empty()) return;
    QList<core::Event> batch;
    batch.reserve(static_cast<qsizetype>(events.size()));
    for (core::Event& event : events) batch.append(std::move(event));
    Q_EMIT window.controller()->eventsReceived(batch);
}

/// Counts paint events of the charts' views.
class PaintCounter : public QObject {
public:
    bool eventFilter(QObject* watched, QEvent* event) override {
        if (event->type() == QEvent::Paint) {
            ++total;
            if (watched == loss) ++lossPaints;
        }
        return false;
    }
    QObject* loss = nullptr;
    int64_t total = 0;
    int64_t lossPaints = 0;
};

/// The viewport a chart is painted on.
QWidget* viewportOf(ui::LiveChart* chart) {
    auto* view = chart->findChild<QGraphicsView*>();
    return view ? view->viewport() : nullptr;
}

/// CPU seconds this process has used (all threads).
double cpuSeconds() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    const auto seconds = [](const timeval& t) {
        return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
    };
    return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double toMiB(int64_t bytes) {
    return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

std::unique_ptr<ui::MainWindow> openWindow() {
    auto window = std::make_unique<ui::MainWindow>();
    window->resize(1280, 800);
    window->show();
    bench::spin(500);
    const QList<core::Event> start = preamble();
    deliver(*window, std::vector<core::Event>(start.begin(), start.end()));
    bench::spin(200);
    return window;
}

nlohmann::json millionPoints(std::vector<std::string>& rows) {
    auto window = openWindow();
    ui::ChartsPanel* charts = window->chartsPanel();
    bench::spin(300);
    const int64_t rssBefore = bench::residentBytes();
    constexpr int64_t kPoints = 1'000'000;
    constexpr int64_t kBatch = 10'000;
    QElapsedTimer ingest;
    ingest.start();
    for (int64_t first = 0; first < kPoints; first += kBatch) {
        std::vector<core::Event> events;
        events.reserve(kBatch);
        for (int64_t i = first; i < first + kBatch; ++i) {
            // Only the step metrics: a loss point each.
            events.push_back(syntheticEvent(i * 12 + 11, static_cast<double>(i) * 0.01));
        }
        deliver(*window, std::move(events));
        QCoreApplication::processEvents();
    }
    const double ingestSeconds = static_cast<double>(ingest.nsecsElapsed()) / 1e9;
    bench::spin(300);
    const int64_t rssAfter = bench::residentBytes();
    const ui::SeriesStore& store = charts->lossChart()->rawStore();
    // Redraw time: one more point makes the loss chart dirty, then thin + replace (redrawNow)
    // and paint its view, 20 times.
    QWidget* viewport = viewportOf(charts->lossChart());
    std::vector<double> redrawMs, paintMs;
    for (int i = 0; i < 20; ++i) {
        deliver(*window, {syntheticEvent((kPoints + i) * 12 + 11, static_cast<double>(kPoints + i) * 0.01)});
        QElapsedTimer timer;
        timer.start();
        charts->redrawNow();
        redrawMs.push_back(static_cast<double>(timer.nsecsElapsed()) / 1e6);
        timer.restart();
        if (viewport) viewport->repaint();
        paintMs.push_back(static_cast<double>(timer.nsecsElapsed()) / 1e6);
    }
    nlohmann::json result = {
        {"points", kPoints},
        {"ingest_seconds", ingestSeconds},
        {"points_per_second", static_cast<double>(kPoints) / ingestSeconds},
        {"store_raw_count", store.rawCount()},
        {"store_points", store.size()},
        {"store_capacity", store.capacity()},
        {"store_group_size", store.groupSize()},
        {"store_bytes", store.size() * sizeof(QPointF)},
        {"drawn_points", charts->lossChart()->drawnPointCount()},
        {"record_steps", window->record().stepCount()},
        {"record_events", window->record().eventCount()},
        {"record_bytes_estimate", window->record().memoryBytes()},
        {"rss_before_bytes", rssBefore},
        {"rss_after_bytes", rssAfter},
        {"rss_growth_bytes", rssAfter - rssBefore},
        {"redraw_ms_median", bench::median(redrawMs)},
        {"redraw_ms_max", bench::percentile(redrawMs, 100)},
        {"paint_ms_median", bench::median(paintMs)},
        {"paint_ms_max", bench::percentile(paintMs, 100)},
    };
    rows.push_back(std::to_string(kPoints) + "," + std::to_string(store.size()) + "," +
                   bench::fixed(toMiB(rssAfter - rssBefore), 1) + "," + bench::fixed(bench::median(redrawMs), 2) + "," +
                   bench::fixed(bench::median(paintMs), 2));
    std::printf("1M loss points: store %zu points (capacity %zu), RSS +%.1f MiB, redraw %.2f ms, paint %.2f ms\n",
                store.size(), store.capacity(), toMiB(rssAfter - rssBefore), bench::median(redrawMs),
                bench::median(paintMs));
    return result;
}

/// A finished run of a million events in a run folder (the synthetic run, written as a run folder's
/// events.jsonl), opened in a fresh window (File → Open run folder): the time until every event is
/// in the views, beside the time the reading alone takes (core's EventFileFollower, no window), the
/// window's latency meanwhile, and its memory.
nlohmann::json openMillionEventRun(std::vector<std::string>& rows) {
    constexpr int64_t kEvents = 1'000'000;
    QTemporaryDir folder;
    const std::string path = folder.filePath(QStringLiteral("events.jsonl")).toStdString();
    {
        std::ofstream out(path);
        for (const core::Event& event : preamble()) out << core::toJsonLine(event) << '\n';
        int64_t written = preamble().size();
        for (int64_t i = 0; written < kEvents - 1; ++i, ++written)
            out << core::toJsonLine(syntheticEvent(i, static_cast<double>(i) * 1e-4)) << '\n';
        out << core::toJsonLine(core::RunStateChanged{100.0, core::RunState::Finished, "done"}) << '\n';
    }
    const auto fileBytes = static_cast<int64_t>(std::ifstream(path, std::ios::ate | std::ios::binary).tellg());

    // The reading alone: parse every line into events.
    QElapsedTimer parse;
    parse.start();
    core::EventFileFollower follower(path);
    int64_t parsed = 0;
    for (;;) {
        auto batch = follower.read();
        if (!batch) break;
        parsed += static_cast<int64_t>(batch->events.size());
        if (batch->atEnd) break;
    }
    const double parseSeconds = static_cast<double>(parse.nsecsElapsed()) / 1e9;

    auto window = std::make_unique<ui::MainWindow>();
    window->resize(1280, 800);
    window->show();
    bench::spin(500);
    const int64_t rssBefore = bench::residentBytes();
    bench::LatencyProbe latency;
    latency.arm();
    QElapsedTimer open;
    open.start();
    window->openRun(folder.path());
    while (!window->watcher()->caughtUp() && window->watcher()->error().isEmpty() && open.elapsed() < 600'000)
        QCoreApplication::processEvents(QEventLoop::AllEvents, 50);
    const double openSeconds = static_cast<double>(open.nsecsElapsed()) / 1e9;
    latency.stop();
    bench::spin(300);
    const int64_t rssAfter = bench::residentBytes();
    const ui::SeriesStore& loss = window->chartsPanel()->lossChart()->rawStore();
    const double p50 = bench::percentile(latency.samples, 50);
    const double p99 = bench::percentile(latency.samples, 99);
    const double max = bench::percentile(latency.samples, 100);
    nlohmann::json result = {
        {"events", window->watcher()->events()},
        {"file_bytes", fileBytes},
        {"open_seconds", openSeconds},
        {"events_per_second", static_cast<double>(window->watcher()->events()) / openSeconds},
        {"parse_only_seconds", parseSeconds},
        {"parse_only_events", parsed},
        {"skipped_lines", window->watcher()->skippedLines()},
        {"ended", window->watcher()->runEnded()},
        {"latency_p50_ms", p50},
        {"latency_p99_ms", p99},
        {"latency_max_ms", max},
        {"loss_points", loss.rawCount()},
        {"loss_store_points", loss.size()},
        {"rss_before_bytes", rssBefore},
        {"rss_after_bytes", rssAfter},
        {"rss_growth_bytes", rssAfter - rssBefore},
    };
    rows.push_back(std::to_string(window->watcher()->events()) + "," + bench::fixed(fileBytes / 1e6, 1) + "," +
                   bench::fixed(openSeconds, 2) + "," + bench::fixed(parseSeconds, 2) + "," + bench::fixed(p50, 1) +
                   "," + bench::fixed(p99, 1) + "," + bench::fixed(toMiB(rssAfter - rssBefore), 1));
    std::printf(
        "open a run of %lld events (%.1f MB): %.2f s (reading alone %.2f s), latency p50 %.1f ms, p99 %.1f "
        "ms, RSS +%.1f MiB\n",
        static_cast<long long>(window->watcher()->events()), fileBytes / 1e6, openSeconds, parseSeconds, p50, p99,
        toMiB(rssAfter - rssBefore));
    std::fflush(stdout);
    return result;
}

}  // namespace

int main(int argc, char** argv) {
    const auto args = bench::parseArgs(argc, argv, "batchpilot-bench-gui",
                                       "The main window under a synthetic event stream (offscreen).");
    const auto app = bench::benchApplication(argc, argv, "batchpilot-bench-gui");
    const auto started = Clock::now();
    nlohmann::json report;
    report["bench"] = "gui";
    report["qt_version"] = qVersion();
    report["platform"] = QGuiApplication::platformName().toStdString();
    report["machine"] = bench::machineDescription();
    std::vector<std::string> rows;
    std::vector<std::string> millionRows;
    std::vector<std::string> latencyRows;

    // A fresh process state for the memory figure: the million points go first.
    report["million"] = millionPoints(millionRows);
    std::vector<std::string> openRows;
    report["open_run"] = openMillionEventRun(openRows);

    const int seconds = args.quick ? 5 : 30;
    auto window = openWindow();
    ui::ChartsPanel* charts = window->chartsPanel();
    PaintCounter paints;
    paints.loss = viewportOf(charts->lossChart());
    for (ui::LiveChart* chart : charts->charts()) {
        if (QWidget* viewport = viewportOf(chart)) viewport->installEventFilter(&paints);
    }
    EventSource source;
    QTimer drain;
    drain.setInterval(kDrainMs);
    QObject::connect(&drain, &QTimer::timeout, [&] { deliver(*window, source.take()); });
    drain.start();
    int64_t nextIndex = 0;
    // Rate 0 first: the latency floor of the idle window on this machine.
    for (const double rate : {0.0, 1000.0, 5000.0, 20000.0}) {
        bench::spin(500);
        const int64_t rssBefore = bench::residentBytes();
        paints.total = paints.lossPaints = 0;
        bench::LatencyProbe latency;
        latency.arm();
        QElapsedTimer phase;
        phase.start();
        const double cpuBefore = cpuSeconds();
        source.start(rate, nextIndex);
        bench::spin(seconds * 1000);
        const int64_t produced = source.stop();
        latency.stop();
        deliver(*window, source.take());
        const double elapsed = static_cast<double>(phase.nsecsElapsed()) / 1e9;
        const double cpuShare = (cpuSeconds() - cpuBefore) / elapsed;
        nextIndex += produced;
        const int64_t rssAfter = bench::residentBytes();
        for (double ms : latency.samples) latencyRows.push_back(bench::fixed(rate, 0) + "," + bench::fixed(ms, 3));
        const double p50 = bench::percentile(latency.samples, 50);
        const double p99 = bench::percentile(latency.samples, 99);
        const double max = bench::percentile(latency.samples, 100);
        const double chartPaintsPerSecond = static_cast<double>(paints.total) / elapsed / 4.0;
        const double lossPaintsPerSecond = static_cast<double>(paints.lossPaints) / elapsed;
        report["rates"].push_back({{"events_per_second", rate},
                                   {"seconds", elapsed},
                                   {"events", produced},
                                   {"achieved_events_per_second", static_cast<double>(produced) / elapsed},
                                   {"latency_samples", latency.samples.size()},
                                   {"process_cpu_share", cpuShare},
                                   {"latency_p50_ms", p50},
                                   {"latency_p99_ms", p99},
                                   {"latency_max_ms", max},
                                   {"loss_chart_repaints_per_second", lossPaintsPerSecond},
                                   {"chart_repaints_per_second", chartPaintsPerSecond},
                                   {"loss_store_points", charts->lossChart()->rawStore().size()},
                                   {"rss_before_bytes", rssBefore},
                                   {"rss_after_bytes", rssAfter},
                                   {"dropped_events", window->controller()->droppedEvents()}});
        rows.push_back(bench::fixed(rate, 0) + "," + std::to_string(produced) + "," + bench::fixed(p50, 2) + "," +
                       bench::fixed(p99, 2) + "," + bench::fixed(max, 2) + "," + bench::fixed(lossPaintsPerSecond, 1) +
                       "," + bench::fixed(cpuShare, 2) + "," + bench::fixed(toMiB(rssBefore), 1) + "," +
                       bench::fixed(toMiB(rssAfter), 1));
        std::printf(
            "%6.0f events/s: latency p50 %.2f ms, p99 %.2f ms, max %.2f ms (%zu samples); loss chart %.1f repaints/s; "
            "CPU %.2f cores; RSS %.1f -> %.1f MiB\n",
            rate, p50, p99, max, latency.samples.size(), lossPaintsPerSecond, cpuShare, toMiB(rssBefore),
            toMiB(rssAfter));
        std::fflush(stdout);
    }
    drain.stop();
    report["seconds"] = std::chrono::duration<double>(Clock::now() - started).count();
    bench::writeJson(args.outDir, "gui.json", report);
    bench::writeCsv(args.outDir, "gui.csv",
                    "events_per_s,events,latency_p50_ms,latency_p99_ms,latency_max_ms,loss_chart_repaints_per_s,"
                    "process_cpu_cores,rss_before_mib,rss_after_mib",
                    rows);
    bench::writeCsv(args.outDir, "gui_million.csv", "loss_points,store_points,rss_growth_mib,redraw_ms,paint_ms",
                    millionRows);
    bench::writeCsv(args.outDir, "gui_latency.csv", "events_per_second,lateness_ms", latencyRows);
    bench::writeCsv(args.outDir, "gui_open_run.csv",
                    "events,file_mb,open_seconds,reading_alone_seconds,latency_p50_ms,latency_p99_ms,rss_growth_mib",
                    openRows);
    std::printf("gui benchmark: %.1f s\n", report["seconds"].get<double>());
    return 0;
}
