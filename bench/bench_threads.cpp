// batchpilot-bench-threads: who uses the CPUs during training, and which thread settings train
// fastest (issue 17). The same fixed-micro-batch run (target batch 512, micro-batch 64, 8
// micro-batches per step, on `cpu`) of the built-in cnn and mlp on synthetic data, and of the cnn
// on 2048 image files decoded again for every micro-batch (the image cache off: data that is slow
// to load), for every combination of
//   host:     headless (a Trainer on its own thread, as the CLI runs it) or the real MainWindow
//             (offscreen, its TrainerController, charts drawn live as in the desktop app);
//   threads:  LibTorch intra-op threads 1 or every CPU;
//   prefetch: the next micro-batch loaded on the prefetch thread, or on the trainer thread;
// interleaved, the order rotated each repetition. Per run: samples/s over steps 2..N, and the
// CPU time of each thread from /proc/self/task (the trainer thread and the intra-op workers it
// starts are named "trainer", the prefetcher "prefetch", the GUI thread is the main thread), as
// cores over the run's wall time; in the window also the event-loop latency (lateness of a 10 ms
// timer). Writes threads.json and threads.csv.
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <QApplication>
#include <QElapsedTimer>
#include <QEventLoop>
#include <QStandardPaths>
#include <QTimer>

#include "bench/bench_util.h"
#include "bench/gui_bench.h"
#include "bench/trainer_workload.h"
#include "core/device/math_libraries.h"
#include "core/train/trainer.h"
#include "ui/window/main_window.h"
#include "ui/session/trainer_controller.h"

namespace {

using namespace batchpilot;
using Clock = std::chrono::steady_clock;

constexpr int kSampleMs = 20;

/// Cumulative CPU ticks (user + system) and name of every thread of this process.
struct ThreadTimes {
    std::string name;
    int64_t ticks = 0;
};

std::map<int64_t, ThreadTimes> readThreads() {
    std::map<int64_t, ThreadTimes> out;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
        std::ifstream in(entry.path() / "stat");
        std::string line;
        if (!std::getline(in, line)) continue;  // the thread ended while we looked
        const auto open = line.find('(');
        const auto close = line.rfind(')');
        if (open == std::string::npos || close == std::string::npos) continue;
        std::istringstream rest(line.substr(close + 2));
        std::vector<std::string> fields{std::istream_iterator<std::string>(rest), {}};
        if (fields.size() < 13) continue;
        // After "pid (comm) ": state is field 3, utime field 14 and stime field 15 (proc(5)).
        out[std::stoll(entry.path().filename().string())] = {line.substr(open + 1, close - open - 1),
                                                             std::stoll(fields[11]) + std::stoll(fields[12])};
    }
    return out;
}

/// Samples every thread's CPU time until stopped; per thread the time it used since start().
class ThreadSampler {
public:
    void start() {
        m_before = readThreads();
        m_last = m_before;
        m_stop = false;
        m_thread = std::thread([this] {
            m_self = static_cast<int64_t>(syscall(SYS_gettid));
            while (!m_stop) {
                std::this_thread::sleep_for(std::chrono::milliseconds(kSampleMs));
                // Only this thread writes m_last until stop() has joined it; ended threads keep
                // their last sample.
                for (auto& [tid, times] : readThreads()) m_last[tid] = std::move(times);
            }
        });
    }
    /// CPU seconds per role: "gui" (the main thread), "training" (threads named "trainer": the
    /// trainer thread and LibTorch's intra-op workers it started), "prefetch", "other".
    std::map<std::string, double> stop() {
        m_stop = true;
        m_thread.join();
        for (auto& [tid, times] : readThreads()) m_last[tid] = std::move(times);
        const double perTick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
        std::map<std::string, double> out{{"gui", 0.0}, {"training", 0.0}, {"prefetch", 0.0}, {"other", 0.0}};
        for (const auto& [tid, times] : m_last) {
            if (tid == m_self) continue;
            const auto before = m_before.find(tid);
            const int64_t used = times.ticks - (before == m_before.end() ? 0 : before->second.ticks);
            const std::string role = tid == getpid()            ? "gui"
                                     : times.name == "trainer"  ? "training"
                                     : times.name == "prefetch" ? "prefetch"
                                                                : "other";
            out[role] += static_cast<double>(used) * perTick;
        }
        return out;
    }

private:
    std::thread m_thread;
    std::atomic<bool> m_stop{false};
    int64_t m_self = 0;
    std::map<int64_t, ThreadTimes> m_before, m_last;
};

class StoringSink final : public core::EventSink {
public:
    void onEvent(const core::Event& event) override { events.push_back(event); }
    std::vector<core::Event> events;
};

struct Variant {
    bool gui = false;
    int threads = 1;
    bool prefetch = true;
    std::string name() const {
        return std::string(gui ? "gui" : "headless") + ", " + std::to_string(threads) + " thread" +
               (threads > 1 ? "s" : "") + ", prefetch " + (prefetch ? "on" : "off");
    }
};

struct RunMeasure {
    double samplesPerSecond = 0;
    double wallSeconds = 0;
    std::map<std::string, double> cores;  ///< CPU seconds per role over the wall time
    double latencyP50 = 0, latencyP99 = 0;
};

/// 2048 random 32x32 colour images as binary PPM files in 10 class folders under `root`.
void writeImages(const std::filesystem::path& root) {
    uint64_t state = 12345;
    std::string pixels(32 * 32 * 3, '\0');
    for (int i = 0; i < 2048; ++i) {
        const auto folder = root / ("class" + std::to_string(i % 10));
        std::filesystem::create_directories(folder);
        for (char& c : pixels) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            c = static_cast<char>(state >> 56);
        }
        std::ofstream out(folder / (std::to_string(i) + ".ppm"), std::ios::binary);
        out << "P6\n32 32\n255\n" << pixels;
        if (!out) throw std::runtime_error("could not write the benchmark's images under " + root.string());
    }
}

/// `workload` is "cnn" or "mlp" (synthetic data) or "cnn-files" (the cnn on `images`, decoded
/// from disk for every micro-batch).
core::TrainerOptions workload(const std::string& name, const Variant& variant, int64_t steps,
                              const std::string& images) {
    core::TrainerOptions options = bench::cnnWorkload("cpu", 512, 64, steps);
    options.model.name = name == "mlp" ? "mlp" : "cnn";
    if (name == "cnn-files") {
        options.data.name = "image-folder";
        options.data.path = images;
        options.data.imageCacheBytes = 0;
    }
    options.intraOpThreads = variant.threads;
    options.prefetch = variant.prefetch ? core::Prefetch::Thread : core::Prefetch::Inline;
    return options;
}

RunMeasure finish(ThreadSampler& sampler, const QElapsedTimer& wall, const std::vector<core::Event>& events,
                  const core::RunResult& result) {
    RunMeasure out;
    const auto cpu = sampler.stop();
    out.wallSeconds = static_cast<double>(wall.nsecsElapsed()) / 1e9;
    if (result.state == core::RunState::Failed) throw std::runtime_error("benchmark run failed: " + result.error);
    out.samplesPerSecond = bench::throughputOf(events, result.microBatch).samplesPerSecond;
    for (const auto& [role, seconds] : cpu) out.cores[role] = seconds / out.wallSeconds;
    return out;
}

RunMeasure runHeadless(const core::TrainerOptions& options) {
    ThreadSampler sampler;
    StoringSink sink;
    core::RunResult result;
    QElapsedTimer wall;
    sampler.start();
    wall.start();
    std::thread worker([&] {
        pthread_setname_np(pthread_self(), "trainer");  // as TrainerController's worker thread
        core::Trainer trainer(options, sink);
        result = trainer.run();
    });
    worker.join();
    return finish(sampler, wall, sink.events, result);
}

RunMeasure runInWindow(ui::MainWindow& window, const core::TrainerOptions& options) {
    ThreadSampler sampler;
    std::vector<core::Event> events;
    core::RunResult result;
    ui::TrainerController* controller = window.controller();
    QEventLoop loop;
    const auto received = QObject::connect(
        controller, &ui::TrainerController::eventsReceived,
        [&](const QList<core::Event>& batch) { events.insert(events.end(), batch.begin(), batch.end()); });
    const auto finished =
        QObject::connect(controller, &ui::TrainerController::runFinished, [&](const core::RunResult& r) {
            result = r;
            loop.quit();
        });
    bench::LatencyProbe latency;
    QElapsedTimer wall;
    sampler.start();
    wall.start();
    latency.arm();
    if (!controller->start(options)) throw std::runtime_error("the window's controller did not start the run");
    loop.exec();
    latency.stop();
    QObject::disconnect(received);
    QObject::disconnect(finished);
    RunMeasure out = finish(sampler, wall, events, result);
    out.latencyP50 = bench::percentile(latency.samples, 50);
    out.latencyP99 = bench::percentile(latency.samples, 99);
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    const auto args = bench::parseArgs(argc, argv, "batchpilot-bench-threads",
                                       "Training throughput and each thread's CPU share, headless and in the window.");
    const auto app = bench::benchApplication(argc, argv, "batchpilot-bench-threads");
    const auto started = Clock::now();
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    const int repetitions = args.quick ? 1 : 3;
    const int64_t steps = args.quick ? 6 : 14;

    std::vector<Variant> variants;
    for (const bool gui : {false, true}) {
        for (const int threads : {1, std::max(2, cores)}) {
            for (const bool prefetch : {true, false}) variants.push_back({gui, threads, prefetch});
        }
    }
    const std::filesystem::path images =
        std::filesystem::temp_directory_path() / ("batchpilot-bench-threads-" + std::to_string(getpid()));
    writeImages(images);
    const std::vector<std::string> workloads{"cnn", "mlp", "cnn-files"};
    ui::MainWindow window;
    window.resize(1280, 800);
    window.show();
    bench::spin(300);

    nlohmann::json report;
    report["bench"] = "threads";
    report["machine"] = bench::machineDescription();
    report["libraries"] = core::describe(core::mathLibraries(0));
    report["workload"] =
        "built-in model on synthetic 3x32x32 data (cnn, mlp) or 2048 PPM files decoded per micro-batch "
        "(cnn-files), cpu, target batch 512, micro-batch 64, SGD, " +
        std::to_string(steps) + " steps, samples/s over steps 2.." + std::to_string(steps);
    std::vector<std::string> rows;
    std::map<std::string, std::vector<RunMeasure>> measured;  // "model|variant"
    for (int repetition = 0; repetition < repetitions; ++repetition) {
        for (const std::string& model : workloads) {
            for (size_t k = 0; k < variants.size(); ++k) {
                const Variant& variant = variants[(k + static_cast<size_t>(repetition)) % variants.size()];
                const core::TrainerOptions options = workload(model, variant, steps, images.string());
                const RunMeasure m = variant.gui ? runInWindow(window, options) : runHeadless(options);
                measured[model + "|" + variant.name()].push_back(m);
                rows.push_back(model + "," + (variant.gui ? "gui" : "headless") + "," +
                               std::to_string(variant.threads) + "," + (variant.prefetch ? "on" : "off") + "," +
                               std::to_string(repetition) + "," + bench::fixed(m.samplesPerSecond, 1) + "," +
                               bench::fixed(m.cores.at("training"), 3) + "," + bench::fixed(m.cores.at("prefetch"), 3) +
                               "," + bench::fixed(m.cores.at("gui"), 3) + "," + bench::fixed(m.cores.at("other"), 3) +
                               "," + bench::fixed(m.latencyP50, 2) + "," + bench::fixed(m.latencyP99, 2));
                std::printf("%s %-36s %8.0f samples/s  cores: training %.2f prefetch %.2f gui %.2f other %.2f\n",
                            model.c_str(), variant.name().c_str(), m.samplesPerSecond, m.cores.at("training"),
                            m.cores.at("prefetch"), m.cores.at("gui"), m.cores.at("other"));
                std::fflush(stdout);
            }
        }
    }
    std::filesystem::remove_all(images);
    for (const std::string& model : workloads) {
        for (const Variant& variant : variants) {
            const auto& runs = measured.at(model + "|" + variant.name());
            const auto medianOf = [&](auto field) {
                std::vector<double> values;
                for (const RunMeasure& m : runs) values.push_back(field(m));
                return bench::median(values);
            };
            nlohmann::json row = {
                {"model", model},
                {"host", variant.gui ? "gui" : "headless"},
                {"threads", variant.threads},
                {"prefetch", variant.prefetch},
                {"runs", runs.size()},
                {"samples_per_second", medianOf([](const RunMeasure& m) { return m.samplesPerSecond; })},
                {"samples_per_second_min",
                 std::min_element(runs.begin(), runs.end(),
                                  [](auto& a, auto& b) { return a.samplesPerSecond < b.samplesPerSecond; })
                     ->samplesPerSecond},
                {"samples_per_second_max",
                 std::max_element(runs.begin(), runs.end(),
                                  [](auto& a, auto& b) { return a.samplesPerSecond < b.samplesPerSecond; })
                     ->samplesPerSecond},
            };
            for (const std::string role : {"training", "prefetch", "gui", "other"}) {
                row["cores_" + role] = medianOf([&](const RunMeasure& m) { return m.cores.at(role); });
            }
            if (variant.gui) {
                row["latency_p50_ms"] = medianOf([](const RunMeasure& m) { return m.latencyP50; });
                row["latency_p99_ms"] = medianOf([](const RunMeasure& m) { return m.latencyP99; });
            }
            report["variants"].push_back(row);
        }
    }
    report["repetitions"] = repetitions;
    report["seconds"] = std::chrono::duration<double>(Clock::now() - started).count();
    bench::writeJson(args.outDir, "threads.json", report);
    bench::writeCsv(
        args.outDir, "threads.csv",
        "model,host,threads,prefetch,repetition,samples_per_s,cores_training,cores_prefetch,cores_gui,cores_other,"
        "latency_p50_ms,latency_p99_ms",
        rows);
    std::printf("threads benchmark: %.1f s\n", report["seconds"].get<double>());
    return 0;
}
