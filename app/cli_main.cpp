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

/// Tells the watcher when training has begun (the first probe or training state), arms the OOM
/// injection, and hands every event to the run folder and the reporter.
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

/// Says `message` after this process's name on stderr; returns `status`, the exit status.
int fail(int status, const std::string& message) {
    std::fprintf(stderr, "%s: %s\n", g_name.c_str(), message.c_str());
    return status;
}

/// --list-devices: the devices, the virtual GPU and its presets, and the math libraries.
int listDevices() {
    for (const auto& device : core::availableDevices()) {
        std::printf("%-10s %s\n", device.id.c_str(), device.description.c_str());
    }
    std::printf("%-14s %s\n", "virtual:<size>", "a simulated GPU: a memory budget, e.g. virtual:512MiB, behind");
    std::printf("%-14s %s\n", "", "PyTorch's caching allocator; virtual:512MiB/exact counts bytes exactly");
    std::printf("%-14s %s\n", "", "(docs/guide/virtual-gpu.md)");
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

/// --save-config FILE: the configuration the flags make, written without training.
int saveConfig(const app::CliRequest& request) {
    if (auto saved = core::saveRunConfig(request.saveConfigPath, request.options); !saved)
        return fail(kExitBadInput, saved.error());
    std::printf("wrote %s\n", request.saveConfigPath.c_str());
    return 0;
}

/// --export-csv RUN_FOLDER: its series as CSV. Stopped by a signal, the export ends, its temporary
/// file removed, nothing replaced.
int exportCsv(const app::CliRequest& request) {
    for (const int number : kStopSignals) std::signal(number, onSignal);
    const auto exported =
        core::exportRunCsv(request.exportCsv, request.csvOut, {}, [] { return g_signal.load() != 0; });
    if (!exported && g_signal.load() != 0) {
        std::fprintf(stderr, "batchpilot-cli: stopped by signal %d: nothing was written\n", g_signal.load());
        return 128 + g_signal.load();
    }
    if (!exported) return fail(kExitBadInput, exported.error());
    std::printf("wrote %s: %lld rows from %lld events\n", exported->path.c_str(),
                static_cast<long long>(exported->rows), static_cast<long long>(exported->events));
    if (exported->skipped > 0) {
        std::fprintf(stderr,
                     "batchpilot-cli: warning: %lld line(s) of %s/events.jsonl were not JSON events and were "
                     "skipped (a run cut off mid-line?)\n",
                     static_cast<long long>(exported->skipped), request.exportCsv.c_str());
    }
    return 0;
}

/// Why --memory-snapshot FILE cannot be written at the end of this run (empty: it can): said now,
/// not after the whole run has trained.
std::string memorySnapshotProblem(const app::CliRequest& request, bool inJob) {
    const auto device = core::parseDeviceName(request.options.device);
    if (inJob || !request.devices.empty() || !device || device->kind != core::DeviceKind::Virtual)
        return "--memory-snapshot needs one virtual device (virtual:<size> or a GPU preset); on a real GPU use "
               "torch.cuda.memory._dump_snapshot() in Python";
    if (std::string why =
            core::whyNotWritable(request.memorySnapshot, "the memory snapshot \"" + request.memorySnapshot + "\"");
        !why.empty())
        return why;
    const std::filesystem::path folder = std::filesystem::path(request.memorySnapshot).parent_path();
    std::error_code error;
    if (!folder.empty() && !std::filesystem::is_directory(folder, error))
        return "no folder \"" + folder.string() + "\" for the memory snapshot \"" + request.memorySnapshot +
               "\": create it, or choose another path";
    return {};
}

/// This process as one rank of a job (RANK and WORLD_SIZE set): joins the others, takes its share
/// of the machine's CPUs, and on ranks other than 0 leaves reporting and recording to rank 0.
/// The error is the exit status.
tl::expected<void, int> joinJob(app::CliRequest& request, const core::RankEnvironment& job) {
    const int rank = job.rank;
    g_name = "batchpilot-cli [rank " + std::to_string(rank) + ", " + request.options.device + "]";
    if (const char* launcher = std::getenv(app::kLauncherVariable); launcher != nullptr)
        g_launcher = static_cast<pid_t>(std::atol(launcher));
    auto joined = core::ProcessGroupLink::join(job, std::chrono::seconds(request.rankTimeoutSeconds));
    if (!joined) return tl::unexpected(fail(kExitFailed, joined.error()));
    request.options.parallel = *joined;
    // Ranks on one machine share its CPUs: each takes its part of them unless --threads says
    // otherwise (all of them each: 2 ranks on 2 cores ran 4 threads on 2 and slowed down).
    if (const int local = job.localWorldSize; local > 0 && request.options.intraOpThreads == 0) {
        request.options.intraOpThreads = core::threadsPerLocalRank(core::intraOpThreadsFor(0), local);
        // The other ranks' threads are busy too: what they take is not free for a prefetch thread.
        request.options.reservedCpus = (local - 1) * request.options.intraOpThreads;
    }
    if (rank > 0) {
        // Rank 0 reports, records the run and keeps the checkpoints for the job; the others
        // train. An events file is kept per rank (FILE.rank1, …).
        request.noRunFolder = true;
        request.quiet = true;
        request.memoryReport = false;
        request.checkEquivalence = -1;
        request.options.checkpoint = {};
        if (!request.eventsPath.empty()) request.eventsPath += ".rank" + std::to_string(rank);
    }
    return {};
}

/// What a run writes besides its checkpoints, each checked or made before anything trains: the
/// run folder, and where --serve listens.
struct Outputs {
    std::unique_ptr<core::RunFolder> folder;
    std::optional<app::ServeAddress> serveAddress;
    bool checkpointsInFolder = false;  ///< checkpoints asked for without a directory go into the run folder
};

/// Checks and makes the run's outputs; the run folder names the checkpoints' directory in
/// `request.options` when they go into it. The error is the exit status.
tl::expected<Outputs, int> prepareOutputs(app::CliRequest& request) {
    Outputs out;
    // The events file is truncated when opened, and a link would truncate what it points to, a
    // FIFO without a reader would block: refused before a run folder is made or anything trained.
    if (!request.eventsPath.empty()) {
        if (const std::string why =
                core::whyNotWritable(request.eventsPath, "the events file \"" + request.eventsPath + "\"");
            !why.empty())
            return tl::unexpected(fail(kExitBadInput, why));
    }
    // Rank 0 serves the job.
    if (!request.serve.empty() && !(request.options.parallel && request.options.parallel->rank() > 0)) {
        auto parsed = app::parseServeAddress(request.serve, request.serveAnyAddress);
        if (!parsed) return tl::unexpected(fail(kExitBadInput, parsed.error()));
        out.serveAddress = *parsed;
    }
    out.checkpointsInFolder = core::checkpointsInRunFolder(request.options);
    if (!request.noRunFolder) {
        const std::string runs = request.runsDirectory.empty() ? core::defaultRunsDirectory() : request.runsDirectory;
        auto made = core::RunFolder::create(runs, request.options);
        if (!made) return tl::unexpected(fail(kExitBadInput, made.error()));
        out.folder = std::move(*made);
    }
    return out;
}

/// --serve: the run's events and commands over HTTP, from `address`. The error is the exit status.
tl::expected<std::unique_ptr<app::RunServer>, int> startServer(const app::ServeAddress& address,
                                                               const core::RunFolder* folder,
                                                               const core::TrainerOptions& options) {
    auto started = app::RunServer::start(address, folder ? folder->path() : std::string());
    if (!started) return tl::unexpected(fail(kExitBadInput, started.error()));
    std::unique_ptr<app::RunServer> server = std::move(*started);
    server->setConfiguration(core::toRunConfig(options).dump(2) + "\n");
    if (!address.loopback) {
        std::fprintf(stderr,
                     "%s: warning: serving on %s, not loopback: anyone who can reach it may watch this run, "
                     "and anyone with the control token (sent unencrypted) may steer it\n",
                     g_name.c_str(), address.host.c_str());
    }
    std::fprintf(stderr, "%s: serving the run at %s\n  watch only: %s\n", g_name.c_str(), server->url().c_str(),
                 server->watchUrl().c_str());
    if (!server->servePath().empty())
        std::fprintf(stderr, "  (both in %s, readable by you only)\n", server->servePath().c_str());
    std::fprintf(stderr, "  from another machine: ssh -L %d:localhost:%d THIS-HOST, then the URL as it is\n",
                 server->port(), server->port());
    return server;
}

/// What the console shows besides the steps: the memory report, the plan on other GPUs, the best
/// checkpoint, the rank, the equivalence check.
void configureReporter(app::ConsoleReporter& reporter, const app::CliRequest& request, core::Trainer& trainer) {
    reporter.setTrainer(&trainer);
    reporter.setMemoryReport(request.memoryReport);
    if (!request.planFor.empty()) {
        const auto device = core::parseDeviceName(request.options.device);
        const core::GpuPreset* gpu = device ? core::findGpuPreset(device->preset) : nullptr;
        reporter.setGpuPlan(core::gpuPlanTargets(request.planFor).value_or(std::vector<core::GpuPlanTarget>{}),
                            request.options.probe.headroom, request.options.device,
                            gpu != nullptr ? core::cublasWorkspaceBytes(*gpu) : 0);
    }
    reporter.setKeepBest(request.options.checkpoint.keepBest);
    if (request.options.parallel) reporter.setRank(request.options.parallel->rank());
    if (request.checkEquivalence >= 0) reporter.requestEquivalenceCheck(request.checkEquivalence);
}

/// --memory-snapshot FILE: the allocator as the last OOM found it (what failed, and why), else as
/// the run ends. Returns why it could not be written (empty: written).
std::string writeMemorySnapshot(const app::CliRequest& request) {
    bool atOom = false;
    const std::vector<core::SegmentView> segments = core::virtualGpuSegments(&atOom);
    const std::string named = "the memory snapshot \"" + request.memorySnapshot + "\"";
    if (auto written = core::replaceFileAtomically(request.memorySnapshot, core::memorySnapshotPickle(segments), named);
        !written)
        return written.error();
    if (!request.quiet) {
        std::printf("memory snapshot %s: %s (open it at https://pytorch.org/memory_viz)\n",
                    atOom ? "at the last out-of-memory error" : "at the end of the run",
                    request.memorySnapshot.c_str());
    }
    return {};
}

/// The run's last lines and its exit status (docs/reference/exit-codes.md): failed, stopped by a
/// signal, trained but not saved, or done.
int reportEnd(const core::RunResult& result, const app::ConsoleReporter& reporter, const app::CliRequest& request,
              const std::string& eventsError, const std::string& snapshotError) {
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
    for (const std::string& error : {result.checkpointError, eventsError, snapshotError}) {
        if (error.empty()) continue;
        std::fprintf(stderr, "%s: error: %s\n", g_name.c_str(), error.c_str());
        status = kExitNotSaved;
    }
    // A signal during the run's last validation drops that pass: stopped too, not done.
    if (const int number = g_signal.load(); number != 0) {
        std::fprintf(stderr, "%s: stopped by signal %d after %lld steps%s\n", g_name.c_str(), number,
                     static_cast<long long>(result.steps),
                     request.options.checkpoint.directory.empty() ? "" : "; the checkpoint holds the last step");
        if (status == 0) status = 128 + number;
    }
    return status;
}

/// Trains as `request` says, on one device (or as one rank of a job), and reports.
int train(app::CliRequest& request) {
    auto outputs = prepareOutputs(request);
    if (!outputs) return outputs.error();
    app::ConsoleReporter reporter(stdout, isatty(fileno(stdout)) != 0, request.quiet);
    if (!request.eventsPath.empty()) {
        if (std::string error; !reporter.openEvents(request.eventsPath, error)) return fail(kExitBadInput, error);
    }
    const core::MathLibraries math = core::mathLibraries(request.options.intraOpThreads);
    if (!request.quiet) std::printf("%s\n", core::describe(math).c_str());
    if (const std::string warning = core::referenceBlasWarning(math); !warning.empty())
        std::fprintf(stderr, "%s: warning: %s\n", g_name.c_str(), warning.c_str());
    if (request.checkpointReplacesResumed && !request.quiet) {
        std::printf("checkpoints replace %s/%s as training goes on (--checkpoint-dir DIR keeps it)\n",
                    request.options.checkpoint.directory.c_str(), core::kCheckpointFile);
    }
    if (outputs->folder && !request.quiet) std::printf("run folder: %s\n", outputs->folder->path().c_str());
    if (outputs->checkpointsInFolder && !request.quiet)
        std::printf("checkpoints: %s\n", request.options.checkpoint.directory.c_str());
    std::unique_ptr<app::RunServer> server;
    if (outputs->serveAddress) {
        auto started = startServer(*outputs->serveAddress, outputs->folder.get(), request.options);
        if (!started) return started.error();
        server = std::move(*started);
    }
    std::atomic<bool> training{false};
    BothSinks reported(reporter, server.get());
    TrainingStarted sink(reported, outputs->folder.get(), training);
    core::Trainer trainer(request.options, sink);
    if (server) {
        server->setTrainer(&trainer, [](const std::string& command) {
            std::fprintf(stderr, "%s: remote command: %s\n", g_name.c_str(), command.c_str());
        });
    }
    configureReporter(reporter, request, trainer);
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
    const std::string snapshotError = request.memorySnapshot.empty() ? std::string() : writeMemorySnapshot(request);
    if (outputs->folder) {
        outputs->folder->flush();
        if (eventsError.empty()) eventsError = outputs->folder->error();
    }
    return reportEnd(result, reporter, request, eventsError, snapshotError);
}

}  // namespace

int main(int argc, char** argv) {
    using namespace batchpilot;
    core::installCountingAllocator();
    const std::vector<std::string> args(argv + 1, argv + argc);
    auto request = app::parseCli(args);
    if (!request) return fail(kExitBadInput, request.error());
    if (request->help) {
        std::fputs(app::cliHelp().c_str(), stdout);
        return 0;
    }
    if (request->optionsReference) {
        std::fputs(core::optionsReference().c_str(), stdout);
        return 0;
    }
    if (request->listDevices) return listDevices();
    if (!request->saveConfigPath.empty()) return saveConfig(*request);
    if (!request->exportCsv.empty()) return exportCsv(*request);
    auto job = core::rankEnvironment();
    if (!job) return fail(kExitBadInput, job.error());
    if (!request->memorySnapshot.empty()) {
        if (const std::string why = memorySnapshotProblem(*request, job->has_value()); !why.empty())
            return fail(kExitBadInput, why);
    }
    if (!request->devices.empty() || *job) {
        if (const std::string problem = core::glooInterfaceProblem(); !problem.empty())
            return fail(kExitBadInput, problem);
    }
    if (!request->devices.empty()) {
        if (*job) {
            return fail(kExitBadInput,
                        "--devices starts one process per device itself, but this process is already rank " +
                            std::to_string((*job)->rank) +
                            " of a job (RANK and WORLD_SIZE are set): give each rank its --device");
        }
        app::LaunchOptions launch;
        launch.devices = request->devices;
        launch.arguments = app::withoutDevicesFlag(args);
        launch.rankTimeout = std::chrono::seconds(request->rankTimeoutSeconds);
        return app::launchRanks(launch);
    }
    if (*job) {
        if (auto joined = joinJob(*request, **job); !joined) return joined.error();
    }
    return train(*request);
}
