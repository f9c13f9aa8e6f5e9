#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <csignal>
#include <optional>
#include <cstdlib>
#include <random>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "app/cli_args.h"
#include "app/cli_progress.h"
#include "app/rank_launcher.h"
#include "core/base/durable_file.h"
#include "core/base/byte_size.h"
#include "core/train/checkpoint.h"
#include "core/device/counting_allocator.h"
#include "core/device/device.h"
#include "core/device/math_libraries.h"
#include "core/memory/gpu_presets.h"
#include "core/memory/memory_snapshot.h"
#include "core/distributed/process_group.h"
#include "core/config/option_schema.h"
#include "core/config/run_config.h"
#include "core/records/run_folder.h"
#include "core/records/series_export.h"
#include "core/train/trainer.h"
#include "app/run_server.h"

namespace {

using namespace batchpilot;

/// Exit statuses (docs/reference/exit-codes.md).
constexpr int kExitFailed = 1;    ///< training failed (an error the run could not recover from)
constexpr int kExitBadInput = 2;  ///< bad flags, configuration, data, model or checkpoint
constexpr int kExitNotSaved = 4;  ///< trained, but a checkpoint or the events file could not be written

/// The signal that asked to stop (0: none). A second one ends the process at once.
std::atomic<int> g_signal{0};
/// Signals that stop a run after the current micro-batch, saving its checkpoint: Ctrl-C, kill, a
/// closed terminal (SIGHUP), and a closed pipe on the output (SIGPIPE: `batchpilot-cli … | head`),
/// which otherwise ended the process at once, without a message or a checkpoint.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};

/// How messages name this process: the program, or with several devices the rank.
std::string g_name = "batchpilot-cli";
/// Several devices: the launcher this worker was started by (0: none); when it is gone (killed),
/// the worker stops as if interrupted.
pid_t g_launcher = 0;

void onSignal(int number) {
    // A closed pipe raises SIGPIPE at every later write to it: only a first one asks to stop.
    if (number == SIGPIPE && g_signal.load() != 0) return;
    if (g_signal.exchange(number) != 0) {
        constexpr char kMessage[] = "\nbatchpilot-cli: second interrupt: exiting now without saving\n";
        [[maybe_unused]] const auto written = ::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
        ::_exit(128 + number);
    }
}

/// Stops the trainer as soon as a signal arrives, whatever the trainer is doing; before training
/// has started (loading data, building the model) nothing can be lost, so the process ends at once.
class InterruptWatcher {
public:
    InterruptWatcher(core::Trainer& trainer, const std::atomic<bool>& training)
        : m_thread([this, &trainer, &training] {
              std::unique_lock lock(m_mutex);
              while (!m_done) {
                  m_wake.wait_for(lock, std::chrono::milliseconds(50));
                  if (g_launcher > 0 && !m_launcherGone && ::getppid() != g_launcher && g_signal.load() == 0) {
                      m_launcherGone = true;
                      std::fprintf(stderr, "\n%s: the launcher of the job is gone\n", g_name.c_str());
                      g_signal.store(SIGHUP);
                  }
                  const int number = g_signal.load();
                  if (number == 0 || m_stopSent) continue;
                  m_stopSent = true;
                  if (!training.load()) {
                      std::fprintf(stderr, "\n%s: interrupted (signal %d) before training started; nothing to save\n",
                                   g_name.c_str(), number);
                      std::fflush(nullptr);
                      ::_exit(128 + number);
                  }
                  std::fprintf(stderr,
                               "\n%s: interrupted (signal %d): stopping after the current %s "
                               "(interrupt again to quit at once)\n",
                               g_name.c_str(), number, g_launcher > 0 ? "training batch" : "micro-batch");
                  trainer.stop();
              }
          }) {}
    ~InterruptWatcher() {
        {
            std::lock_guard lock(m_mutex);
            m_done = true;
        }
        m_wake.notify_all();
        m_thread.join();
    }

private:
    std::mutex m_mutex;
    std::condition_variable m_wake;
    bool m_done = false;
    bool m_stopSent = false;
    bool m_launcherGone = false;
    std::thread m_thread;
};

/// Tells the watcher when training has begun (the first probe or training state), and hands
/// every event to the reporter and the run folder.
/// Fault injection for tests of recovery across processes (docs/guide/several-devices.md):
/// BATCHPILOT_INJECT_OOMS="COUNT,MEAN,SEED" makes COUNT counted allocations of the training fail
/// as out-of-memory errors, each at a random distance (1 to 2×MEAN allocations) after the last;
/// with BATCHPILOT_INJECT_OOMS_RANK=R only in rank R of a job.
class OomInjection {
public:
    OomInjection() {
        const char* text = std::getenv("BATCHPILOT_INJECT_OOMS");
        const char* onlyRank = std::getenv("BATCHPILOT_INJECT_OOMS_RANK");
        const char* rank = std::getenv("RANK");
        if (onlyRank != nullptr && (rank == nullptr || std::string(onlyRank) != rank)) return;
        long long count = 0;
        long long mean = 0;
        unsigned long long seed = 0;
        if (text == nullptr || std::sscanf(text, "%lld,%lld,%llu", &count, &mean, &seed) != 3 || count <= 0 ||
            mean <= 0)
            return;
        m_left = count;
        m_mean = mean;
        m_random.seed(seed);
    }
    /// Arms the next failure (when training started, and after each OOM).
    void arm() {
        if (m_left <= 0) return;
        --m_left;
        std::uniform_int_distribution<int64_t> distance(1, 2 * m_mean);
        core::CountingAllocator::instance().failAfter(distance(m_random));
    }

private:
    int64_t m_left = 0;
    int64_t m_mean = 0;
    std::mt19937_64 m_random;
};

/// For tests of several devices: BATCHPILOT_DELAY_VALIDATION=SECONDS holds the trainer for that
/// long after each validation pass, as a long pass would (the other ranks wait for it), whatever
/// the machine's speed.
double validationDelay() {
    const char* text = std::getenv("BATCHPILOT_DELAY_VALIDATION");
    double seconds = 0;
    if (text == nullptr || std::sscanf(text, "%lf", &seconds) != 1 || !(seconds > 0) || seconds > 3600) return 0;
    return seconds;
}

/// Each event to `first`, then to `second` when there is one.
class BothSinks final : public core::EventSink {
public:
    BothSinks(core::EventSink& first, core::EventSink* second) : m_first(first), m_second(second) {}
    void onEvent(const core::Event& event) override {
        m_first.onEvent(event);
        if (m_second) m_second->onEvent(event);
    }

private:
    core::EventSink& m_first;
    core::EventSink* m_second;
};

class TrainingStarted final : public core::EventSink {
public:
    TrainingStarted(core::EventSink& next, core::EventSink* folder, std::atomic<bool>& training)
        : m_next(next), m_folder(folder), m_training(training) {}
    void onEvent(const core::Event& event) override {
        if (std::holds_alternative<core::ValidationDone>(event) && m_validationDelay > 0)
            std::this_thread::sleep_for(std::chrono::duration<double>(m_validationDelay));
        if (const auto* s = std::get_if<core::RunStateChanged>(&event);
            s && (s->state == core::RunState::Probing || s->state == core::RunState::Training)) {
            if (!m_training.exchange(true)) m_injection.arm();
        }
        if (std::holds_alternative<core::OomEvent>(event)) m_injection.arm();
        if (m_folder) m_folder->onEvent(event);
        m_next.onEvent(event);
    }

private:
    core::EventSink& m_next;
    core::EventSink* m_folder;
    std::atomic<bool>& m_training;
    OomInjection m_injection;
    const double m_validationDelay = validationDelay();
};

}  // namespace

int main(int argc, char** argv) {
    using namespace batchpilot;
    core::installCountingAllocator();
    auto request = app::parseCli(std::vector<std::string>(argv + 1, argv + argc));
    if (!request) {
        std::fprintf(stderr, "batchpilot-cli: %s\n", request.error().c_str());
        return kExitBadInput;
    }
    if (request->help) {
        std::fputs(app::cliHelp().c_str(), stdout);
        return 0;
    }
    if (request->optionsReference) {
        std::fputs(core::optionsReference().c_str(), stdout);
        return 0;
    }
    if (request->listDevices) {
        for (const auto& device : core::availableDevices()) {
            std::printf("%-10s %s\n", device.id.c_str(), device.description.c_str());
        }
        std::printf("%-10s %s\n", "virtual:<size>", "a simulated GPU with a memory budget, e.g. virtual:512MiB");
        std::printf("%-10s %s\n", "",
                    "(virtual:512MiB/caching adds PyTorch's caching allocator: docs/guide/virtual-gpu.md)");
        std::printf("\nSimulated GPUs (PyTorch's caching allocator, a CUDA context, the cuBLAS workspace):\n");
        for (const core::GpuPreset& gpu : core::gpuPresets()) {
            const std::string id = "virtual:" + std::string(gpu.name);
            std::printf("%-18s %s, %s as PyTorch reports it, compute capability %d.%d\n", id.c_str(),
                        std::string(gpu.description).c_str(), core::formatBytes(gpu.capacityBytes).c_str(),
                        gpu.computeCapability / 10, gpu.computeCapability % 10);
        }
        const core::MathLibraries math = core::mathLibraries();
        std::printf("\n%s\n", core::describe(math).c_str());
        if (math.blasLibrary.size() > 0) std::printf("BLAS library: %s\n", math.blasLibrary.c_str());
        if (const std::string warning = core::referenceBlasWarning(math); !warning.empty()) {
            std::fprintf(stderr, "batchpilot-cli: warning: %s\n", warning.c_str());
        }
        return 0;
    }
    if (!request->saveConfigPath.empty()) {
        if (auto saved = core::saveRunConfig(request->saveConfigPath, request->options); !saved) {
            std::fprintf(stderr, "batchpilot-cli: %s\n", saved.error().c_str());
            return 2;
        }
        std::printf("wrote %s\n", request->saveConfigPath.c_str());
        return 0;
    }
    if (!request->exportCsv.empty()) {
        // Stopped by a signal: the export ends, its temporary file removed, nothing replaced.
        for (const int number : kStopSignals) std::signal(number, onSignal);
        const auto exported =
            core::exportRunCsv(request->exportCsv, request->csvOut, {}, [] { return g_signal.load() != 0; });
        if (!exported && g_signal.load() != 0) {
            std::fprintf(stderr, "batchpilot-cli: stopped by signal %d: nothing was written\n", g_signal.load());
            return 128 + g_signal.load();
        }
        if (!exported) {
            std::fprintf(stderr, "batchpilot-cli: %s\n", exported.error().c_str());
            return kExitBadInput;
        }
        std::printf("wrote %s: %lld rows from %lld events\n", exported->path.c_str(),
                    static_cast<long long>(exported->rows), static_cast<long long>(exported->events));
        if (exported->skipped > 0) {
            std::fprintf(stderr,
                         "batchpilot-cli: warning: %lld line(s) of %s/events.jsonl were not JSON events and were "
                         "skipped (a run cut off mid-line?)\n",
                         static_cast<long long>(exported->skipped), request->exportCsv.c_str());
        }
        return 0;
    }
    auto job = core::rankEnvironment();
    if (!job) {
        std::fprintf(stderr, "batchpilot-cli: %s\n", job.error().c_str());
        return kExitBadInput;
    }
    if (!request->memorySnapshot.empty()) {
        const auto device = core::parseDeviceName(request->options.device);
        std::string why;
        if (*job || !request->devices.empty() || !device || device->kind != core::DeviceKind::Virtual)
            why =
                "--memory-snapshot needs one virtual device (virtual:<size> or a GPU preset); on a real GPU use "
                "torch.cuda.memory._dump_snapshot() in Python";
        else
            why = core::whyNotWritable(request->memorySnapshot,
                                       "the memory snapshot \"" + request->memorySnapshot + "\"");
        // Said now, not after the whole run has trained.
        const std::filesystem::path folder = std::filesystem::path(request->memorySnapshot).parent_path();
        std::error_code error;
        if (why.empty() && !folder.empty() && !std::filesystem::is_directory(folder, error))
            why = "no folder \"" + folder.string() + "\" for the memory snapshot \"" + request->memorySnapshot +
                  "\": create it, or choose another path";
        if (!why.empty()) {
            std::fprintf(stderr, "%s: %s\n", g_name.c_str(), why.c_str());
            return kExitBadInput;
        }
    }
    if (!request->devices.empty() || *job) {
        if (const std::string problem = core::glooInterfaceProblem(); !problem.empty()) {
            std::fprintf(stderr, "batchpilot-cli: %s\n", problem.c_str());
            return kExitBadInput;
        }
    }
    if (!request->devices.empty()) {
        if (*job) {
            std::fprintf(stderr,
                         "batchpilot-cli: --devices starts one process per device itself, but this process is "
                         "already rank %d of a job (RANK and WORLD_SIZE are set): give each rank its --device\n",
                         (*job)->rank);
            return kExitBadInput;
        }
        app::LaunchOptions launch;
        launch.devices = request->devices;
        launch.arguments = app::withoutDevicesFlag(std::vector<std::string>(argv + 1, argv + argc));
        launch.rankTimeout = std::chrono::seconds(request->rankTimeoutSeconds);
        return app::launchRanks(launch);
    }
    if (*job) {
        const int rank = (*job)->rank;
        g_name = "batchpilot-cli [rank " + std::to_string(rank) + ", " + request->options.device + "]";
        if (const char* launcher = std::getenv(app::kLauncherVariable); launcher != nullptr)
            g_launcher = static_cast<pid_t>(std::atol(launcher));
        auto joined = core::ProcessGroupLink::join(**job, std::chrono::seconds(request->rankTimeoutSeconds));
        if (!joined) {
            std::fprintf(stderr, "%s: %s\n", g_name.c_str(), joined.error().c_str());
            return kExitFailed;
        }
        request->options.parallel = *joined;
        // Ranks on one machine share its CPUs: each takes its part of them unless --threads says
        // otherwise (all of them each: 2 ranks on 2 cores ran 4 threads on 2 and slowed down).
        if (const int local = (*job)->localWorldSize; local > 0 && request->options.intraOpThreads == 0)
            request->options.intraOpThreads = core::threadsPerLocalRank(core::intraOpThreadsFor(0), local);
        if (rank > 0) {
            // Rank 0 reports, records the run and keeps the checkpoints for the job; the others
            // train. An events file is kept per rank (FILE.rank1, …).
            request->noRunFolder = true;
            request->quiet = true;
            request->memoryReport = false;
            request->checkEquivalence = -1;
            request->options.checkpoint = {};
            if (!request->eventsPath.empty()) request->eventsPath += ".rank" + std::to_string(rank);
        }
    }
    // Refused before a run folder is made or anything trained: the events file is truncated when
    // opened, and a link would truncate what it points to, a FIFO without a reader would block.
    if (!request->eventsPath.empty()) {
        if (const std::string why =
                core::whyNotWritable(request->eventsPath, "the events file \"" + request->eventsPath + "\"");
            !why.empty()) {
            std::fprintf(stderr, "%s: %s\n", g_name.c_str(), why.c_str());
            return kExitBadInput;
        }
    }
    // --serve: its address checked before anything is made or trained; rank 0 serves the job.
    std::optional<app::ServeAddress> serveAddress;
    if (!request->serve.empty() && !(request->options.parallel && request->options.parallel->rank() > 0)) {
        auto parsed = app::parseServeAddress(request->serve, request->serveAnyAddress);
        if (!parsed) {
            std::fprintf(stderr, "%s: %s\n", g_name.c_str(), parsed.error().c_str());
            return kExitBadInput;
        }
        serveAddress = *parsed;
    }
    std::unique_ptr<core::RunFolder> folder;
    // Checkpoints asked for without a directory go into the run folder, which names it now.
    const bool checkpointsInFolder = core::checkpointsInRunFolder(request->options);
    if (!request->noRunFolder) {
        const std::string runs = request->runsDirectory.empty() ? core::defaultRunsDirectory() : request->runsDirectory;
        auto made = core::RunFolder::create(runs, request->options);
        if (!made) {
            std::fprintf(stderr, "%s: %s\n", g_name.c_str(), made.error().c_str());
            return kExitBadInput;
        }
        folder = std::move(*made);
    }
    app::ConsoleReporter reporter(stdout, isatty(fileno(stdout)) != 0, request->quiet);
    if (!request->eventsPath.empty()) {
        std::string error;
        if (!reporter.openEvents(request->eventsPath, error)) {
            std::fprintf(stderr, "%s: %s\n", g_name.c_str(), error.c_str());
            return 2;
        }
    }
    {
        const core::MathLibraries math = core::mathLibraries(request->options.intraOpThreads);
        if (!request->quiet) std::printf("%s\n", core::describe(math).c_str());
        if (const std::string warning = core::referenceBlasWarning(math); !warning.empty()) {
            std::fprintf(stderr, "%s: warning: %s\n", g_name.c_str(), warning.c_str());
        }
    }
    if (request->checkpointReplacesResumed && !request->quiet) {
        std::printf("checkpoints replace %s/%s as training goes on (--checkpoint-dir DIR keeps it)\n",
                    request->options.checkpoint.directory.c_str(), core::kCheckpointFile);
    }
    std::atomic<bool> training{false};
    if (folder && !request->quiet) std::printf("run folder: %s\n", folder->path().c_str());
    if (checkpointsInFolder && !request->quiet) {
        std::printf("checkpoints: %s\n", request->options.checkpoint.directory.c_str());
    }
    std::unique_ptr<app::RunServer> server;
    if (serveAddress) {
        auto started = app::RunServer::start(*serveAddress, folder ? folder->path() : std::string());
        if (!started) {
            std::fprintf(stderr, "%s: %s\n", g_name.c_str(), started.error().c_str());
            return kExitBadInput;
        }
        server = std::move(*started);
        server->setConfiguration(core::toRunConfig(request->options).dump(2) + "\n");
        if (!app::isLoopback(serveAddress->host)) {
            std::fprintf(stderr,
                         "%s: warning: serving on %s, not loopback: anyone who can reach it may watch this run, "
                         "and anyone with the control token (sent unencrypted) may steer it\n",
                         g_name.c_str(), serveAddress->host.c_str());
        }
        std::fprintf(stderr, "%s: serving the run at %s\n  watch only: %s\n", g_name.c_str(), server->url().c_str(),
                     server->watchUrl().c_str());
        if (!server->servePath().empty())
            std::fprintf(stderr, "  (both in %s, readable by you only)\n", server->servePath().c_str());
        std::fprintf(stderr, "  from another machine: ssh -L %d:localhost:%d THIS-HOST, then the URL as it is\n",
                     server->port(), server->port());
    }
    BothSinks reported(reporter, server.get());
    TrainingStarted sink(reported, folder.get(), training);
    core::Trainer trainer(request->options, sink);
    if (server) {
        server->setTrainer(&trainer, [](const std::string& command) {
            std::fprintf(stderr, "%s: remote command: %s\n", g_name.c_str(), command.c_str());
        });
    }
    reporter.setTrainer(&trainer);
    reporter.setMemoryReport(request->memoryReport);
    if (!request->planFor.empty()) {
        const auto device = core::parseDeviceName(request->options.device);
        const core::GpuPreset* gpu = device ? core::findGpuPreset(device->preset) : nullptr;
        reporter.setGpuPlan(core::gpuPlanTargets(request->planFor).value_or(std::vector<core::GpuPlanTarget>{}),
                            request->options.probe.headroom, request->options.device,
                            gpu != nullptr ? core::cublasWorkspaceBytes(*gpu) : 0);
    }
    reporter.setKeepBest(request->options.checkpoint.keepBest);
    if (request->options.parallel) reporter.setRank(request->options.parallel->rank());
    if (request->checkEquivalence >= 0) reporter.requestEquivalenceCheck(request->checkEquivalence);
    for (const int number : kStopSignals) std::signal(number, onSignal);
    core::RunResult result;
    {
        InterruptWatcher watcher(trainer, training);
        result = trainer.run();
    }
    if (server) {
        // Every client gets the run's last event before the process ends (a few seconds at most).
        server->finish();
        server->drain(std::chrono::seconds(10));
        server.reset();
    }
    std::string eventsError = reporter.closeEvents();
    std::string snapshotError;
    if (!request->memorySnapshot.empty()) {
        // The allocator as the last OOM found it (what failed, and why), else as the run ends.
        bool atOom = false;
        const std::vector<core::SegmentView> segments = core::virtualGpuSegments(&atOom);
        const std::string named = "the memory snapshot \"" + request->memorySnapshot + "\"";
        if (auto written =
                core::replaceFileAtomically(request->memorySnapshot, core::memorySnapshotPickle(segments), named);
            !written) {
            snapshotError = written.error();
        } else if (!request->quiet) {
            std::printf("memory snapshot %s: %s (open it at https://pytorch.org/memory_viz)\n",
                        atOom ? "at the last out-of-memory error" : "at the end of the run",
                        request->memorySnapshot.c_str());
        }
    }
    if (folder) {
        folder->flush();
        if (eventsError.empty()) eventsError = folder->error();
    }
    if (result.state == core::RunState::Failed) {
        std::fprintf(stderr, "%s: %s\n", g_name.c_str(), result.error.c_str());
        if (!eventsError.empty()) std::fprintf(stderr, "%s: %s\n", g_name.c_str(), eventsError.c_str());
        if (!snapshotError.empty()) std::fprintf(stderr, "%s: %s\n", g_name.c_str(), snapshotError.c_str());
        return result.badInput ? kExitBadInput : kExitFailed;
    }
    const auto& last = reporter.lastStep();
    const std::string otherRanks =
        reporter.otherRankOomCount() > 0
            ? " (" + std::to_string(reporter.otherRankOomCount()) + " more on the other ranks)"
            : std::string();
    std::printf("\n%s after %lld steps: loss %.4f, micro-batch %lld, %d OOM event(s) recovered%s, peak %.1f MiB\n",
                result.stopped || g_signal.load() != 0 ? "stopped" : "done", static_cast<long long>(result.steps),
                last.loss, static_cast<long long>(result.microBatch), reporter.oomCount(), otherRanks.c_str(),
                core::toMiB(last.peakBytes));
    if (const std::string validation = reporter.validationSummary(); !validation.empty())
        std::printf("%s\n", validation.c_str());
    std::fflush(stdout);
    // Whatever --quiet says: a run whose results were not saved must not look like a success.
    int status = 0;
    if (!result.checkpointError.empty()) {
        std::fprintf(stderr, "%s: error: %s\n", g_name.c_str(), result.checkpointError.c_str());
        status = kExitNotSaved;
    }
    if (!eventsError.empty()) {
        std::fprintf(stderr, "%s: error: %s\n", g_name.c_str(), eventsError.c_str());
        status = kExitNotSaved;
    }
    if (!snapshotError.empty()) {
        std::fprintf(stderr, "%s: error: %s\n", g_name.c_str(), snapshotError.c_str());
        status = kExitNotSaved;
    }
    // A signal during the run's last validation drops that pass: stopped too, not done.
    if (const int number = g_signal.load(); number != 0) {
        std::fprintf(stderr, "%s: stopped by signal %d after %lld steps%s\n", g_name.c_str(), number,
                     static_cast<long long>(result.steps),
                     request->options.checkpoint.directory.empty() ? "" : "; the checkpoint holds the last step");
        if (status == 0) status = 128 + number;
    }
    return status;
}
